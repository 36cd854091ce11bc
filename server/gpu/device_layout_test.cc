// DeviceSlotLayout: where fields live in a device slot, with and without conversion. Needs
// no GPU (pure layout arithmetic), so it runs in CI.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/gpu/device_slot_layout.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

SlotLayout ImageLayout(int batch) {
  std::vector<FieldLayout> fields = {{"image", ferry::v1::UINT8, {224, 224, 3}, 224 * 224 * 3},
                                     {"label", ferry::v1::INT64, {}, 8},
                                     {"index", ferry::v1::INT64, {}, 8}};
  return *SlotLayout::Make(fields, batch);
}

TEST(DeviceSlotLayoutTest, UnconvertedIsTheHostLayout) {
  SlotLayout host = ImageLayout(32);
  auto d = DeviceSlotLayout::Make(host, ferry::v1::ImageOutput());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->image_field, -1);
  EXPECT_EQ(d->offsets, host.offsets);
  EXPECT_GE(d->slot_bytes, host.slot_bytes);
  EXPECT_EQ(d->slot_bytes % (2 << 20), 0u);
}

TEST(DeviceSlotLayoutTest, NormalizedImagesAreChwFloatsWithStaging) {
  SlotLayout host = ImageLayout(8);
  ferry::v1::ImageOutput out;
  out.set_dtype(ferry::v1::BFLOAT16);
  auto d = DeviceSlotLayout::Make(host, out);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->image_field, 0);
  EXPECT_EQ(d->fields[0].dtype, ferry::v1::BFLOAT16);
  EXPECT_EQ(d->fields[0].shape, (std::vector<int64_t>{3, 224, 224}));
  EXPECT_EQ(d->fields[0].row_bytes, 3u * 224 * 224 * 2);
  // The normalized images come first; the whole host slot lands after them (one copy per
  // batch), and label and index are read where they land; everything fits.
  EXPECT_EQ(d->offsets[0], 0u);
  EXPECT_GE(d->staging_offset, 8 * d->fields[0].row_bytes);
  EXPECT_EQ(d->staging_offset % 256, 0u);
  EXPECT_EQ(d->convert_input_offset, d->staging_offset + host.offsets[0]);
  EXPECT_EQ(d->offsets[1], d->staging_offset + host.offsets[1]);
  EXPECT_EQ(d->offsets[2], d->staging_offset + host.offsets[2]);
  EXPECT_LE(d->staging_offset + host.slot_bytes, d->slot_bytes);
  EXPECT_FLOAT_EQ(d->mean[0], 0.485f);
  EXPECT_FLOAT_EQ(d->std[2], 0.225f);
}

// A GPU-decoding job's routed JPEGs (its last field, 256 KiB a row) stay in the host slot,
// where nvJPEG reads them: the device slot ends before them, converted or not.
TEST(DeviceSlotLayoutTest, RoutedJpegsStayInTheHostSlot) {
  std::vector<FieldLayout> fields = {
      {"image", ferry::v1::UINT8, {224, 224, 3}, 224 * 224 * 3},
      {"label", ferry::v1::INT64, {}, 8},
      {"index", ferry::v1::INT64, {}, 8},
      {kGpuDecodePlanField, ferry::v1::UINT8, {72}, 72, ferry::v1::DTYPE_UNSPECIFIED, true},
      {kGpuDecodeJpegField,
       ferry::v1::UINT8,
       {256 << 10},
       256 << 10,
       ferry::v1::DTYPE_UNSPECIFIED,
       true}};
  SlotLayout host = *SlotLayout::Make(fields, 64);
  ASSERT_GT(host.slot_bytes - host.offsets[4], 64u * (256 << 10) - 1);
  auto plain = DeviceSlotLayout::Make(host, ferry::v1::ImageOutput());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->host_only_field, 4);
  EXPECT_EQ(plain->slot_bytes, (host.offsets[4] + (2 << 20) - 1) / (2 << 20) * (2 << 20));
  EXPECT_LT(plain->slot_bytes, host.slot_bytes);
  ferry::v1::ImageOutput out;
  out.set_dtype(ferry::v1::BFLOAT16);
  auto normalized = DeviceSlotLayout::Make(host, out);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  EXPECT_EQ(normalized->host_only_field, 4);
  EXPECT_GE(normalized->slot_bytes, normalized->staging_offset + host.offsets[4]);
  EXPECT_LT(normalized->slot_bytes, normalized->staging_offset + host.offsets[4] + (2 << 20));
  // Without the JPEG field every host byte crosses.
  EXPECT_EQ(DeviceSlotLayout::Make(ImageLayout(64), ferry::v1::ImageOutput())->host_only_field, -1);
}

TEST(DeviceSlotLayoutTest, BadRequestsNameTheField) {
  SlotLayout host = ImageLayout(8);
  ferry::v1::ImageOutput out;
  out.set_dtype(ferry::v1::INT64);
  EXPECT_THAT(DeviceSlotLayout::Make(host, out).status().message(),
              HasSubstr("image_output.dtype"));
  out.set_dtype(ferry::v1::FLOAT32);
  out.add_mean(0.5f);
  EXPECT_THAT(DeviceSlotLayout::Make(host, out).status().message(), HasSubstr("image_output.mean"));
  out.clear_mean();
  for (float v : {1.f, 0.f, 1.f}) out.add_std(v);
  EXPECT_THAT(DeviceSlotLayout::Make(host, out).status().message(), HasSubstr("positive"));
  std::vector<FieldLayout> tokens = {{"tokens", ferry::v1::INT64, {9}, 72}};
  ferry::v1::ImageOutput f32;
  f32.set_dtype(ferry::v1::FLOAT32);
  EXPECT_THAT(DeviceSlotLayout::Make(*SlotLayout::Make(tokens, 4), f32).status().message(),
              HasSubstr("no image field"));
}

TEST(DeviceSlotLayoutTest, RawTokensAreWidenedThroughStaging) {
  for (auto [in, in_size] : {std::pair{ferry::v1::UINT16, 2u}, std::pair{ferry::v1::UINT32, 4u},
                             std::pair{ferry::v1::INT32, 4u}}) {
    for (auto [out, size] : {std::pair{ferry::v1::INT64, 8u}, std::pair{ferry::v1::INT32, 4u}}) {
      if (in == out) continue;
      std::vector<FieldLayout> raw = {
          {.name = "tokens",
           .dtype = in,
           .shape = {9},
           .row_bytes = 9 * in_size,
           .device_dtype = out},
          {.name = "index", .dtype = ferry::v1::INT64, .shape = {}, .row_bytes = 8}};
      SlotLayout host = *SlotLayout::Make(raw, 4);
      auto d = DeviceSlotLayout::Make(host, ferry::v1::ImageOutput());
      ASSERT_TRUE(d.ok()) << d.status();
      EXPECT_EQ(d->token_field, 0);
      EXPECT_EQ(d->token_input, in);
      EXPECT_EQ(d->token_dtype, out);
      EXPECT_EQ(d->image_field, -1);
      EXPECT_EQ(d->fields[0].dtype, out);
      EXPECT_EQ(d->fields[0].row_bytes, 9u * size);
      EXPECT_EQ(d->fields[0].shape, (std::vector<int64_t>{9}));
      EXPECT_EQ(d->offsets[0], 0u);
      EXPECT_GE(d->staging_offset, 4 * d->fields[0].row_bytes);
      EXPECT_EQ(d->convert_input_offset, d->staging_offset + host.offsets[0]);
      EXPECT_EQ(d->offsets[1], d->staging_offset + host.offsets[1]);
      EXPECT_LE(d->staging_offset + host.slot_bytes, d->slot_bytes);
    }
  }
  // A widening the transport does not do is a source's bug.
  std::vector<FieldLayout> odd = {{.name = "tokens",
                                   .dtype = ferry::v1::UINT16,
                                   .shape = {9},
                                   .row_bytes = 18,
                                   .device_dtype = ferry::v1::FLOAT32}};
  EXPECT_EQ(
      DeviceSlotLayout::Make(*SlotLayout::Make(odd, 4), ferry::v1::ImageOutput()).status().code(),
      absl::StatusCode::kInternal);
  // Already widened on the host (the CPU transport, or UINT32 -> INT32): copied as is.
  std::vector<FieldLayout> wide = {{"tokens", ferry::v1::INT32, {9}, 36}};
  auto d = DeviceSlotLayout::Make(*SlotLayout::Make(wide, 4), ferry::v1::ImageOutput());
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->converts());
}

}  // namespace
}  // namespace ferry
