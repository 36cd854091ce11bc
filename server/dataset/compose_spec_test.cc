#include "server/dataset/compose_spec.h"

#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "server/dataset/image_folder_source.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

ferry::v1::JobSpec Spec(const std::string& json) {
  ferry::v1::JobSpec spec;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &spec);
  EXPECT_TRUE(status.ok()) << status.ToString() << " in " << json;
  return spec;
}

std::string ParseError(const std::string& ops) {
  const ferry::v1::JobSpec spec = Spec(R"({"transform":{"compose":{"ops":)" + ops + "}}}");
  absl::StatusOr<ImageTransform> t = ImageTransformFromSpec(spec.transform());
  EXPECT_FALSE(t.ok()) << ops;
  return std::string(t.status().message());
}

TEST(ComposeSpecTest, FillsTorchvisionsDefaults) {
  const ferry::v1::JobSpec spec = Spec(R"({"transform":{"compose":{"ops":[
      {"random_resized_crop":{"size":224}}, {"random_horizontal_flip":{}},
      {"random_crop":{"size":224,"padding":[1,2]}}, {"color_jitter":{"brightness":[0.4],
      "hue":[0.1]}}, {"random_grayscale":{}}, {"trivial_augment_wide":{}},
      {"normalize":{"mean":[0.5],"std":[0.25]}}, {"random_erasing":{}}]}}})");
  absl::StatusOr<std::vector<ComposeStep>> steps = ComposeStepsFromSpec(spec.transform().compose());
  ASSERT_TRUE(steps.ok()) << steps.status();
  const std::vector<ComposeStep>& s = *steps;
  EXPECT_EQ(s[0].scale[0], 0.08);
  EXPECT_EQ(s[0].ratio[1], 4.0 / 3.0);
  EXPECT_EQ(s[1].p, 0.5f);
  EXPECT_EQ(s[2].padding[0], 1);  // [left/right, top/bottom] -> (1, 2, 1, 2)
  EXPECT_EQ(s[2].padding[1], 2);
  EXPECT_EQ(s[2].padding[2], 1);
  EXPECT_EQ(s[2].padding[3], 2);
  EXPECT_TRUE(s[3].jitter.has_brightness);
  EXPECT_FLOAT_EQ(s[3].jitter.brightness[0], 0.6f);
  EXPECT_FLOAT_EQ(s[3].jitter.brightness[1], 1.4f);
  EXPECT_FALSE(s[3].jitter.has_contrast);
  EXPECT_FLOAT_EQ(s[3].jitter.hue[0], -0.1f);
  EXPECT_EQ(s[4].p, 0.1f);
  EXPECT_EQ(s[5].num_magnitude_bins, 31);
  EXPECT_EQ(s[6].mean[2], 0.5f);
  EXPECT_EQ(s[6].std[1], 0.25f);
  EXPECT_EQ(s[7].erasing.p, 0.5f);
  EXPECT_FLOAT_EQ(s[7].erasing.ratio[1], 3.3f);
  // An explicit p = 0 stays 0 (not the default).
  const ferry::v1::JobSpec zero =
      Spec(R"({"transform":{"compose":{"ops":[{"random_vertical_flip":{"p":0}}]}}})");
  EXPECT_EQ(ComposeStepsFromSpec(zero.transform().compose())->at(0).p, 0.0f);
}

TEST(ComposeSpecTest, ErrorsNameTheFieldOrTheOp) {
  EXPECT_THAT(ParseError(R"([{"random_crop":{"size":8,"padding":[1,2,3]}}])"),
              HasSubstr("transform.compose.ops[0].random_crop.padding takes 1, 2 or 4 values"));
  EXPECT_THAT(ParseError(R"([{"center_crop":{"size":8}},{"color_jitter":{"hue":[0.7]}}])"),
              HasSubstr("transform.compose.ops[1].color_jitter.hue must be a range"));
  EXPECT_THAT(ParseError(R"([{"center_crop":{"size":8}},{"random_crop":{"size":8,
                             "padding_mode":"wrap"}}])"),
              HasSubstr("ops[1].random_crop.padding_mode must be"));
  EXPECT_THAT(ParseError(R"([{"center_crop":{"size":8}},{}])"),
              HasSubstr("transform.compose.ops[1] sets no op"));
  EXPECT_THAT(ParseError(R"([{"center_crop":{"size":8}},{"normalize":{"mean":[0.5,0.5]}}])"),
              HasSubstr("ops[1].normalize.mean takes 1 or 3 values"));
  EXPECT_THAT(ParseError(R"([{"resize":{"size":8}}])"),
              HasSubstr("transform.compose.ops: the output size depends on each image"));
  EXPECT_THAT(ParseError(R"([{"center_crop":{"size":8}},{"normalize":{"mean":[0],"std":[1]}},
                             {"random_vertical_flip":{}}])"),
              HasSubstr("transform.compose.ops[2] (RandomVerticalFlip): comes after Normalize"));
  EXPECT_THAT(ParseError(R"([{"center_crop":{"size":8}},{"random_erasing":{"scale":[0.5,2]}}])"),
              HasSubstr("ops[1] (RandomErasing): scale must be 0 <= min <= max <= 1"));
}

TEST(ComposeSpecTest, TargetFollowsTheDeviceAndImageOutput) {
  SourceOptions gpu;
  gpu.device_images = true;
  const std::string normalize =
      R"({"transform":{"compose":{"ops":[{"center_crop":{"size":8}},
         {"normalize":{"mean":[0.5],"std":[0.5]}}]}})";
  // A Normalize on a GPU job: the device runs it (FLOAT32 by default).
  EXPECT_TRUE(ComposeTargetFor(Spec(normalize + "}"), gpu, false)->device_program);
  // The CPU path does it on the workers.
  EXPECT_FALSE(ComposeTargetFor(Spec(normalize + "}"), SourceOptions(), false)->device_program);
  // No Normalize, no float image_output: uint8 to the GPU, every op on the workers.
  EXPECT_FALSE(ComposeTargetFor(Spec(R"({"transform":{"compose":{"ops":[
      {"center_crop":{"size":8}}]}}})"),
                                gpu, false)
                   ->device_program);
  const absl::StatusOr<ComposedTransform::Target> bf16 =
      ComposeTargetFor(Spec(R"({"transform":{"compose":{"ops":[{"center_crop":{"size":8}}]}},
               "image_output":{"dtype":"BFLOAT16","mean":[0.1,0.2,0.3]}})"),
                       gpu, true);
  ASSERT_TRUE(bf16.ok());
  EXPECT_TRUE(bf16->device_program);
  EXPECT_TRUE(bf16->exif_orientation);
  EXPECT_FLOAT_EQ(bf16->device_mean[2], 0.3f);
  EXPECT_THAT(
      ComposeTargetFor(Spec(normalize + R"(,"image_output":{"dtype":"UINT8"}})"), gpu, false)
          .status()
          .message(),
      HasSubstr("image_output.dtype is UINT8 but transform.compose has a Normalize"));
  EXPECT_THAT(
      ComposeTargetFor(Spec(normalize + R"(,"image_output":{"mean":[0.1,0.2,0.3]}})"), gpu, false)
          .status()
          .message(),
      HasSubstr("differ from transform.compose's Normalize"));
}

}  // namespace
}  // namespace ferry
