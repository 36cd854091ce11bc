#pragma once

inline int Seam() { return 4; }
