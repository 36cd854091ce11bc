"""ferry.MegatronGPT: its arguments are GPTDatasetConfig's, checked here with Megatron-LM's
defaults; what ferryd delivers for them is tested against Megatron-Core's own output in
server/dataset/megatron_gpt_reference_test.cc and tests/integration/test_megatron_gpt.py."""

import unittest

import ferry


class MegatronGptArgsTest(unittest.TestCase):
    def test_spec_uses_proto_field_names_and_megatrons_defaults(self):
        spec = ferry.MegatronGPT("/d/wiki_text_document", 2048, eod_token=0)._spec()
        self.assertEqual(spec, {"megatron_gpt": {
            "path_prefixes": ["/d/wiki_text_document"], "sequence_length": 2048,
            "split": "969, 30, 1", "split_name": "TRAIN", "random_seed": 1234, "eod_token": 0,
            "mid_level_dataset_surplus": 0.005, "output_dtype": "INT64"}})
        blend = ferry.MegatronGPT(["/d/a", "/d/b"], 8, eod_token=2, weights=[0.7, 0.3],
                                  split_name="valid", num_samples=100, pad_token=1,
                                  reset_position_ids=True, create_attention_mask=True,
                                  add_extra_token_to_sequence=False,
                                  drop_last_partial_validation_sequence=False,
                                  cu_seqlens=True, output_dtype="int32")._spec()["megatron_gpt"]
        self.assertEqual(blend["weights"], [0.7, 0.3])
        self.assertEqual(blend["split_name"], "VALID")
        self.assertEqual(blend["num_samples"], 100)
        self.assertEqual(blend["pad_token"], 1)
        for flag in ("reset_position_ids", "create_attention_mask", "no_extra_token",
                     "keep_partial_validation_sequence", "cu_seqlens"):
            self.assertIs(blend[flag], True, flag)
        self.assertEqual(blend["output_dtype"], "INT32")

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "without .bin"):
            ferry.MegatronGPT("/d/x.bin", 8, eod_token=0)
        with self.assertRaisesRegex(ValueError, "sequence_length must be >= 2"):
            ferry.MegatronGPT("/d/x", 1, eod_token=0)
        with self.assertRaisesRegex(ValueError, "needs one weight each"):
            ferry.MegatronGPT(["/d/a", "/d/b"], 8, eod_token=0)
        with self.assertRaisesRegex(ValueError, "2 entries for 1"):
            ferry.MegatronGPT("/d/a", 8, eod_token=0, weights=[1, 2])
        with self.assertRaisesRegex(ValueError, "weights\\[1\\]"):
            ferry.MegatronGPT(["/d/a", "/d/b"], 8, eod_token=0, weights=[1, 0], num_samples=4)
        with self.assertRaisesRegex(ValueError, "num_samples must be given for a blend"):
            ferry.MegatronGPT(["/d/a", "/d/b"], 8, eod_token=0, weights=[1, 1])
        with self.assertRaisesRegex(ValueError, "split_name"):
            ferry.MegatronGPT("/d/a", 8, eod_token=0, split_name="validation")
        with self.assertRaisesRegex(ValueError, "random_seed must be <= 4294967295"):
            ferry.MegatronGPT("/d/a", 8, eod_token=0, random_seed=2**32)
        with self.assertRaises(TypeError):
            ferry.MegatronGPT("/d/a", 8, eod_token=0, create_attention_mask="yes")


if __name__ == "__main__":
    unittest.main()
