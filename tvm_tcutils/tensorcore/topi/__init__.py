"""Integer tensor-core (WMMA) computes and CUDA schedules: conv2d HWNC and dense."""
