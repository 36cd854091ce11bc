#include "lib/lib.h"

int ClientValue() { return LibValue() + 2; }
