// torchvision's ImageNet normalisation, RGB order: what a GPU job's image_output uses when it
// names no mean or std, and what a composed transform's device step falls back to.
#ifndef FERRY_COMMON_IMAGENET_H_
#define FERRY_COMMON_IMAGENET_H_

#include <array>

namespace ferry {

inline constexpr std::array<float, 3> kImageNetMean = {0.485f, 0.456f, 0.406f};
inline constexpr std::array<float, 3> kImageNetStd = {0.229f, 0.224f, 0.225f};

}  // namespace ferry

#endif  // FERRY_COMMON_IMAGENET_H_
