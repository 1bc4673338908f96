// ResolveEncoderConfig: Hugging Face's and sentence-transformers' files as the registry
// reads them, and a matrix of refusals, each naming the file, the field and the value.
#include "server/models/encoder_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::server {
namespace {

using ::testing::HasSubstr;

constexpr char kMiniLm[] = R"({"architectures": ["BertModel"], "hidden_act": "gelu",
  "hidden_size": 384, "intermediate_size": 1536, "layer_norm_eps": 1e-12,
  "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
  "num_hidden_layers": 6, "position_embedding_type": "absolute", "type_vocab_size": 2,
  "vocab_size": 30522})";
constexpr char kModules[] =
    R"([{"idx": 0, "type": "sentence_transformers.models.Transformer"},
  {"idx": 1, "type": "sentence_transformers.models.Pooling"},
  {"idx": 2, "type": "sentence_transformers.models.Normalize"}])";
constexpr char kMeanPooling[] =
    R"({"pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true})";

absl::StatusOr<v1::ModelConfig> Resolve(const EncoderFiles& files,
                                        v1::ModelConfig config = v1::ModelConfig()) {
  config.mutable_encoder();
  absl::Status status = ResolveEncoderConfig(files, &config);
  if (!status.ok()) return status;
  return config;
}

TEST(EncoderConfigTest, ReadsASentenceTransformersFolder) {
  auto config = Resolve({kMiniLm, kModules, kMeanPooling});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->d_model(), 384);
  EXPECT_EQ(config->num_heads(), 12);
  const v1::EncoderConfig& encoder = config->encoder();
  EXPECT_EQ(encoder.num_layers(), 6);
  EXPECT_EQ(encoder.ffn_dim(), 1536);
  EXPECT_EQ(encoder.vocab_size(), 30522);
  EXPECT_EQ(encoder.max_positions(), 512);
  EXPECT_FLOAT_EQ(encoder.layer_norm_eps(), 1e-12f);
  EXPECT_EQ(encoder.activation(), v1::EncoderConfig::ACTIVATION_GELU);
  EXPECT_EQ(encoder.pooling(), v1::EncoderConfig::POOLING_MEAN);
  EXPECT_EQ(encoder.normalization(), v1::EncoderConfig::NORMALIZATION_L2);
  auto spec = EncoderSpecFromConfig(*config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->normalize);
}

TEST(EncoderConfigTest, ReadsSentenceTransformers6sLayoutAndADistilBertConfig) {
  // sentence-transformers 6 saves its modules under new type names and names the
  // pooling mode.
  constexpr char kModules6[] =
      R"([{"idx": 0, "type": "sentence_transformers.base.modules.transformer.Transformer"},
  {"idx": 1, "type": "sentence_transformers.base.modules.pooling.Pooling"},
  {"idx": 2, "type": "sentence_transformers.base.modules.normalize.Normalize"}])";
  auto config =
      Resolve({R"({"model_type": "distilbert", "dim": 32, "n_heads": 4,
                             "n_layers": 2, "hidden_dim": 64, "activation": "relu",
                             "vocab_size": 600, "max_position_embeddings": 64})",
               kModules6, R"({"embedding_dimension": 32, "pooling_mode": "cls"})"});
  ASSERT_TRUE(config.ok()) << config.status();
  const v1::EncoderConfig& encoder = config->encoder();
  EXPECT_EQ(encoder.family(), v1::EncoderConfig::FAMILY_DISTILBERT);
  EXPECT_EQ(config->d_model(), 32);
  EXPECT_EQ(config->num_heads(), 4);
  EXPECT_EQ(encoder.num_layers(), 2);
  EXPECT_EQ(encoder.ffn_dim(), 64);
  EXPECT_EQ(encoder.type_vocab_size(), 1);
  EXPECT_EQ(encoder.activation(), v1::EncoderConfig::ACTIVATION_RELU);
  EXPECT_FLOAT_EQ(encoder.layer_norm_eps(), 1e-12f);
  EXPECT_EQ(encoder.pooling(), v1::EncoderConfig::POOLING_CLS);
  EXPECT_EQ(encoder.normalization(), v1::EncoderConfig::NORMALIZATION_L2);
  auto spec = EncoderSpecFromConfig(*config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->family, core::EncoderSpec::Family::kDistilBert);
}

TEST(EncoderConfigTest, MpnetTakesItsOwnDefaultsAndOnlyPostLn) {
  // transformers' MPNetConfig defaults: 12 layers, 30527 tokens; positions after the
  // padding index 1 (514 rows serve 512 tokens); 32 buckets.
  auto config = Resolve({R"({"model_type": "mpnet"})", "", ""});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->encoder().family(), v1::EncoderConfig::FAMILY_MPNET);
  EXPECT_EQ(config->encoder().num_layers(), 12);
  EXPECT_EQ(config->encoder().vocab_size(), 30527);
  EXPECT_EQ(config->encoder().position_offset(), 2);
  EXPECT_EQ(config->encoder().type_vocab_size(), 1);
  auto spec = EncoderSpecFromConfig(*config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->relative_attention_buckets, core::EncoderSpec::kMpnetBuckets);
  // Without a model_type to check it against, config.pbtxt's family holds, and only
  // BERT's family comes pre-LN.
  v1::ModelConfig pbtxt;
  pbtxt.mutable_encoder()->set_family(v1::EncoderConfig::FAMILY_MPNET);
  pbtxt.mutable_encoder()->set_norm_placement(v1::EncoderConfig::NORM_PLACEMENT_PRE);
  EXPECT_THAT(Resolve({"{}", "", ""}, pbtxt).status().message(),
              HasSubstr("encoder.norm_placement: FAMILY_MPNET's blocks are post-LN"));
}

TEST(EncoderConfigTest, ConfigPbtxtWinsAndBertDefaultsFillTheRest) {
  v1::ModelConfig pbtxt;
  pbtxt.mutable_encoder()->set_pooling(v1::EncoderConfig::POOLING_CLS);
  pbtxt.mutable_encoder()->set_normalization(v1::EncoderConfig::NORMALIZATION_NONE);
  // A bare BERT checkpoint: no sentence-transformers files.
  auto config = Resolve({R"({"hidden_act": "gelu_new"})", "", ""}, pbtxt);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->d_model(), 768);  // BERT-base's defaults
  EXPECT_EQ(config->encoder().num_layers(), 12);
  EXPECT_EQ(config->encoder().activation(), v1::EncoderConfig::ACTIVATION_GELU_TANH);
  EXPECT_EQ(config->encoder().pooling(), v1::EncoderConfig::POOLING_CLS);
  EXPECT_EQ(config->encoder().normalization(), v1::EncoderConfig::NORMALIZATION_NONE);
}

TEST(EncoderConfigTest, RefusesWhatItDoesNotServeNamingIt) {
  const struct {
    EncoderFiles files;
    const char* expected;
  } cases[] = {
      {{"{", "", ""}, "config.json: not valid JSON"},
      {{"[1]", "", ""}, "config.json: must be a JSON object"},
      {{std::string(40, '[') + std::string(40, ']'), "", ""},
       "config.json: nested deeper than 32 levels"},
      {{R"({"model_type": "deberta"})", "", ""},
       "config.json: model_type \"deberta\" is not served (served: \"bert\", "
       "\"megatron-bert\", \"distilbert\", \"roberta\""},
      {{R"({"model_type": "qwen3", "num_attention_heads": 4, "num_key_value_heads": 3})",
        "", ""},
       "config.json: num_key_value_heads 3 must divide num_attention_heads 4"},
      {{R"({"model_type": "qwen3", "head_dim": 0})", "", ""},
       "config.json: head_dim must be an integer in [1, 2^31), got 0"},
      {{R"({"model_type": "qwen3", "head_dim": 2000000000})", "", ""},
       "config.json: head_dim must be at most 65536, got 2000000000"},
      {{R"({"model_type": "qwen2", "is_causal": false})", "", ""},
       "config.json: is_causal false (a bidirectional Qwen) is not served"},
      {{R"({"model_type": "qwen2", "use_sliding_window": true})", "", ""},
       "config.json: use_sliding_window true is not served"},
      {{R"({"model_type": "qwen3", "rope_scaling": {"type": "yarn"}})", "", ""},
       "config.json: rope_scaling {\"type\":\"yarn\"} is not served"},
      {{R"({"model_type": "qwen3", "layer_types": ["sliding_attention"]})", "", ""},
       "config.json: layer_types[0] \"sliding_attention\" is not served"},
      {{R"({"model_type": "new", "rope_scaling": {"type": "ntk", "factor": 2, "mixed_b": 1}})",
        "", ""},
       "no mixed_b"},
      {{R"({"model_type": "new", "rope_scaling": {"type": "dynamic", "factor": 2}})", "",
        ""},
       "config.json: rope_scaling {\"factor\":2,\"type\":\"dynamic\"} is not served"},
      {{R"({"model_type": "new", "layer_norm_type": "rms_norm"})", "", ""},
       "config.json: layer_norm_type \"rms_norm\" is not served"},
      {{R"({"model_type": "new", "pack_qkv": false})", "", ""},
       "config.json: pack_qkv false"},
      {{R"({"model_type": "new", "position_embedding_type": "absolute"})", "", ""},
       "position_embedding_type \"absolute\" is not served (served: \"rope\")"},
      {{R"({"model_type": "gte", "logn_attention_scale": true})", "", ""},
       "config.json: logn_attention_scale true is not served"},
      {{R"({"model_type": "mpnet", "relative_attention_num_buckets": 64})", "", ""},
       "config.json: relative_attention_num_buckets 64 is not served"},
      {{R"({"model_type": "mpnet", "max_position_embeddings": 2})", "", ""},
       "max_position_embeddings 2 leaves no position after MPNet's padding index 1"},
      {{R"({"model_type": "roberta", "max_position_embeddings": 2})", "", ""},
       "max_position_embeddings 2 leaves no position after pad_token_id 1"},
      {{R"({"model_type": "distilbert", "activation": "swish"})", "", ""},
       "config.json: activation \"swish\" is not served"},
      {{R"({"model_type": "distilbert", "dim": 0})", "", ""},
       "config.json: dim must be an integer"},
      {{R"({"model_type": "electra", "embedding_size": 128})", "", ""},
       "embedding_size 128 differs from hidden_size 768"},
      {{R"({"model_type": "xlm-roberta", "pad_token_id": 1.5})", "", ""},
       "pad_token_id must be an integer in [0, 2^20), got 1.5"},
      {{R"({"position_embedding_type": "relative_key"})", "", ""},
       "position_embedding_type \"relative_key\" is not served"},
      {{R"({"is_decoder": true})", "", ""}, "decoders are not served"},
      {{R"({"hidden_act": "silu"})", "", ""}, "hidden_act \"silu\" is not served"},
      {{R"({"hidden_size": "384"})", "", ""},
       "config.json: hidden_size must be an integer in [1, 2^31), got \"384\""},
      {{R"({"num_hidden_layers": 0})", "", ""}, "num_hidden_layers must be an integer"},
      {{R"({"num_hidden_layers": 1e99})", "", ""},
       "num_hidden_layers must be an integer"},
      {{R"({"layer_norm_eps": -1})", "", ""},
       "layer_norm_eps must be a number in (0, 1]"},
      {{R"({"hidden_size": 100, "num_attention_heads": 12})", "", ""},
       "d_model (100) must be a multiple of num_heads (12)"},
      {{kMiniLm, "{}", ""}, "modules.json: must be a JSON array"},
      {{kMiniLm, R"([{"type": 3}])", ""}, "modules.json: type must be a string, got 3"},
      {{kMiniLm, R"([{"type": "sentence_transformers.models.Asym"}])", ""},
       "modules.json: [0] type \"sentence_transformers.models.Asym\" is not served"},
      {{kMiniLm, R"([{"type": "sentence_transformers.models.Dense"}])", ""},
       "modules.json: [0] Dense path \"\" must be one folder's name"},
      {{kMiniLm, R"([{"type": "sentence_transformers.models.Dense", "path": "2_Dense"}])",
        ""},
       "modules.json: [0] Dense before the Pooling is not served"},
      {{kMiniLm,
        R"([{"type": "sentence_transformers.models.Pooling"},
            {"type": "sentence_transformers.models.Dense", "path": "2_Dense"}])",
        ""},
       "2_Dense/config.json: modules.json lists a Dense module there, and its "
       "config.json is missing"},
      {{kMiniLm,
        R"([{"type": "sentence_transformers.models.Normalize"},
            {"type": "sentence_transformers.models.Pooling"}])",
        ""},
       "modules.json: [1] Pooling after Normalize is not served"},
      {{kMiniLm, "", R"({"pooling_mode": "median"})"},
       "1_Pooling/config.json: pooling_mode \"median\" is not served"},
      {{kMiniLm, "", R"({"pooling_mode": ["cls", "max"]})"},
       "pooling_mode must be one mode's name"},
      {{kMiniLm, "", R"({"pooling_mode_max_tokens": false})"},
       "exactly one pooling_mode_* flag must be true, and 0 are"},
      {{kMiniLm, "",
        R"({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true})"},
       "exactly one pooling_mode_* flag must be true, and 2 are"},
      {{kMiniLm, "", R"({"pooling_mode_cls_token": "yes"})"},
       "pooling_mode_cls_token must be true or false, got \"yes\""},
  };
  for (const auto& test : cases) {
    auto config = Resolve(test.files);
    absl::Status status = config.status();
    if (status.ok()) status = EncoderSpecFromConfig(*config).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << test.expected;
    EXPECT_THAT(std::string(status.message()), HasSubstr(test.expected));
  }
}

TEST(EncoderConfigTest, RefusesAConfigPbtxtThatContradictsConfigJson) {
  v1::ModelConfig pbtxt;
  pbtxt.set_d_model(512);
  auto config = Resolve({kMiniLm, "", ""}, pbtxt);
  EXPECT_THAT(std::string(config.status().message()),
              HasSubstr("d_model is 512 in config.pbtxt but 384 in config.json"));
  v1::ModelConfig pre;
  pre.mutable_encoder()->set_norm_placement(v1::EncoderConfig::NORM_PLACEMENT_PRE);
  config = Resolve({kMiniLm, "", ""}, pre);
  EXPECT_THAT(
      std::string(config.status().message()),
      HasSubstr("encoder.norm_placement is NORM_PLACEMENT_PRE in config.pbtxt but "
                "config.json's model_type \"bert\" has NORM_PLACEMENT_POST"));
}

TEST(EncoderConfigTest, QwenAndGteNeedTheirModelTypeAndQwenDefaultsToSilu) {
  // Their variants' defaults differ by model_type: a family from config.pbtxt alone is
  // refused.
  for (const auto family :
       {v1::EncoderConfig::FAMILY_QWEN, v1::EncoderConfig::FAMILY_GTE}) {
    v1::ModelConfig pbtxt;
    pbtxt.mutable_encoder()->set_family(family);
    auto config =
        Resolve({R"({"hidden_size": 64, "num_attention_heads": 4})", "", ""}, pbtxt);
    EXPECT_THAT(std::string(config.status().message()),
                HasSubstr("config.json: model_type is required for"));
  }
  auto qwen = Resolve({R"({"model_type": "qwen2", "hidden_size": 64,
      "num_attention_heads": 4, "num_key_value_heads": 2})",
                       "", ""});
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->encoder().activation(), v1::EncoderConfig::ACTIVATION_SILU);
  auto spec = EncoderSpecFromConfig(*qwen);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->causal);
  EXPECT_EQ(spec->norm, core::EncoderSpec::Norm::kRms);
  EXPECT_EQ(spec->num_kv_heads, 2);
  // RMSNorm or a causal mask alone, outside the Qwen family, is refused.
  spec->family = core::EncoderSpec::Family::kBert;
  spec->norm_placement = core::EncoderSpec::NormPlacement::kPost;
  spec->norm = core::EncoderSpec::Norm::kLayerNorm;
  EXPECT_THAT(std::string(spec->Validate().message()), HasSubstr("Qwen family only"));
  spec->causal = false;
  spec->norm = core::EncoderSpec::Norm::kRms;
  EXPECT_THAT(std::string(spec->Validate().message()), HasSubstr("Qwen family only"));
}

TEST(EncoderConfigTest, TheModelTypeSaysWhereTheNormsSit) {
  auto bert = Resolve({kMiniLm, "", ""});
  ASSERT_TRUE(bert.ok()) << bert.status();
  EXPECT_EQ(bert->encoder().norm_placement(), v1::EncoderConfig::NORM_PLACEMENT_POST);
  auto megatron = Resolve({R"({"model_type": "megatron-bert", "hidden_size": 64,
      "num_attention_heads": 4})",
                           "", ""});
  ASSERT_TRUE(megatron.ok()) << megatron.status();
  EXPECT_EQ(megatron->encoder().norm_placement(), v1::EncoderConfig::NORM_PLACEMENT_PRE);
  auto spec = EncoderSpecFromConfig(*megatron);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->norm_placement, core::EncoderSpec::NormPlacement::kPre);
  // Without a model_type to check against, config.pbtxt decides.
  v1::ModelConfig pre;
  pre.mutable_encoder()->set_norm_placement(v1::EncoderConfig::NORM_PLACEMENT_PRE);
  auto bare = Resolve({"{}", "", ""}, pre);
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->encoder().norm_placement(), v1::EncoderConfig::NORM_PLACEMENT_PRE);
}

// A *ForSequenceClassification checkpoint classifies: its labels from id2label, its
// activation as sentence-transformers' CrossEncoder applies it.
TEST(EncoderConfigTest, ASequenceClassifierGetsItsLabelsAndActivation) {
  const std::string reranker =
      R"({"architectures": ["BertForSequenceClassification"], "model_type": "bert",
          "id2label": {"0": "LABEL_0"}})";
  auto config = Resolve({reranker, "", "", "", ""});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->encoder().task(), v1::EncoderConfig::TASK_CLASSIFY);
  EXPECT_THAT(config->encoder().labels(), ::testing::ElementsAre("LABEL_0"));
  EXPECT_EQ(config->encoder().score_activation(),
            v1::EncoderConfig::SCORE_ACTIVATION_SIGMOID);
  auto spec = EncoderSpecFromConfig(*config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->num_labels, 1);
  EXPECT_EQ(spec->pooled_width(), 1);

  const std::string classifier =
      R"({"architectures": ["BertForSequenceClassification"], "model_type": "bert",
          "id2label": {"2": "positive", "0": "negative", "1": "neutral"}})";
  config = Resolve({classifier, "", "", "", ""});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(config->encoder().labels(),
              ::testing::ElementsAre("negative", "neutral", "positive"));
  EXPECT_EQ(config->encoder().score_activation(),
            v1::EncoderConfig::SCORE_ACTIVATION_SOFTMAX);
  // What CrossEncoder recorded wins over the label count.
  config = Resolve({classifier, "", "", "",
                    R"({"activation_fn": "torch.nn.modules.linear.Identity"})"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->encoder().score_activation(),
            v1::EncoderConfig::SCORE_ACTIVATION_NONE);
  // An embedder stays one.
  config = Resolve({kMiniLm, kModules, kMeanPooling});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->encoder().task(), v1::EncoderConfig::TASK_EMBED);
  EXPECT_EQ(EncoderSpecFromConfig(*config)->num_labels, 0);
}

TEST(EncoderConfigTest, RefusesABadClassificationHeadNamingTheField) {
  const auto refused = [](const std::string& json, const std::string& st,
                          const std::string& words) {
    auto config = Resolve({json, "", "", "", st});
    ASSERT_FALSE(config.ok()) << json;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr(words)) << json;
  };
  const std::string head =
      R"({"architectures": ["BertForSequenceClassification"], "model_type": "bert", )";
  refused(head + R"("id2label": {"0": "a", "0x": "b"}})", "",
          "id2label must map each id");
  refused(head + R"("id2label": {"0": "a", "2": "b"}})", "", "id2label must map each id");
  refused(head + R"("id2label": {"0": 7}})", "", "id2label must map each id");
  refused(head + R"("id2label": {}})", "", "id2label must be an object of 1 to");
  refused(head + R"("id2label": {"0": "a"}})",
          R"({"activation_fn": "torch.nn.modules.activation.Tanh"})",
          "activation_fn \"torch.nn.modules.activation.Tanh\" is not served");
  refused(R"({"architectures": "BertModel"})", "", "architectures must be a list");
  refused(R"({"architectures": [7]})", "", "architectures must hold strings");
  v1::ModelConfig embed;
  embed.mutable_encoder()->set_task(v1::EncoderConfig::TASK_EMBED);
  embed.mutable_encoder()->add_labels("x");
  auto config = Resolve({kMiniLm, kModules, kMeanPooling}, embed);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("apply to task TASK_CLASSIFY only"));
}

}  // namespace
}  // namespace attnserve::server
