#include "lib/lib.h"

#include "internal/secret.h"  // relative to this file: lib/internal/secret.h, allowed here
#include "lib/internal/secret.h"

int LibValue() { return Secret(); }
