// KF_SM90A: 1 in device code compiled for sm_90a (the arch-specific features: TMA tensor copies with
// multicast, wgmma, setmaxnreg), 0 elsewhere (host code, sm_80, sm_90 without the "a", later majors).
// Kernels that use those instructions wrap their bodies in #if KF_SM90A and run only on an sm_90
// device from a 90a-real image (the launchers check the binary version).
#pragma once

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KF_SM90A 1
#else
#define KF_SM90A 0
#endif
