/* The backends' tables (dfl/backend.h), for the registry in backend.c. */
#ifndef DFL_BACKEND_INTERNAL_H
#define DFL_BACKEND_INTERNAL_H

#include "dfl/backend.h"

extern const dfl_backend dfl_backend_cpu; /* src/models/forward.c */
#ifdef DFL_HAVE_CUDA
extern const dfl_backend dfl_backend_cuda; /* src/backend/cuda/cuda_backend.c */
/* A GPU and driver answer: DFL_OK, else DFL_ERR with the CUDA runtime's reason. */
int cuda_device_check(void);
#endif

#endif
