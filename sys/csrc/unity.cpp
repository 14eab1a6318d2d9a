// All of tchtrain's C++ as one translation unit: each file below includes libtorch headers
// that take ~10-40 s to parse, so compiled one by one they cost ~200 s on one core; here the
// headers are parsed once (~45 s). Each file keeps its own helpers in an anonymous namespace,
// so helper names must differ across files.
#include "guard.cpp"
#include "autocast.cpp"
#include "backends.cpp"
#include "checkpoint.cpp"
#include "quantized_linear.cpp"
#include "chunked_logprob.cpp"
#include "generator.cpp"
#include "dropout.cpp"
#include "grad_boundary.cpp"
#include "cpu_cache.cpp"
#include "optim.cpp"
#include "c10d.cpp"
#include "ddp.cpp"
#include "shard_reducer.cpp"
