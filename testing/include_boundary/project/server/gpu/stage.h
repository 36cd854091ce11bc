#pragma once

inline int GpuStage() { return 3; }
