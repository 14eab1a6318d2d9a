// Frees an error message returned by any function of the shim (see guard.h).
#include "guard.h"

extern "C" void tchtrain_free_error(char* err) { std::free(err); }
