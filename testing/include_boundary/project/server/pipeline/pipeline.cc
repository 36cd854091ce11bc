#include "server/transport/delivery_ring.h"

int Pipeline() { return Seam(); }
