#pragma once

inline int HostRing() { return 5; }
