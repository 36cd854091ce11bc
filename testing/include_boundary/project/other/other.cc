#include "other/other.h"

#include "lib/lib.h"

int OtherValue() { return LibValue() + 1; }
