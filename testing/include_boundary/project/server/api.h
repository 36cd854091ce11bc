#pragma once

inline int ServerValue() { return 3; }
