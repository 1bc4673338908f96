// The family table (core/encoder/encoder_family.h) walked row by row: each row is
// complete, its proto value is attention.proto's, each of its model_types resolves to it
// through the config reader, and each golden checkpoint of the family loads through it.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "attnserve/v1/attention.pb.h"
#include "core/encoder/encoder_family.h"
#include "core/io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/models/encoder_config.h"

namespace attnserve::server {
namespace {

using core::BlockLayout;
using core::EncoderFamily;

bool Named(const char* name) { return name != nullptr && *name != '\0'; }

TEST(FamilyTableTest, EveryRowIsCompleteForItsLayout) {
  std::set<int> ids, proto_values;
  std::set<std::string> model_types;
  for (const EncoderFamily& row : core::EncoderFamilies()) {
    SCOPED_TRACE(row.name);
    EXPECT_TRUE(ids.insert(static_cast<int>(row.id)).second) << "id twice";
    EXPECT_TRUE(proto_values.insert(row.proto_value).second) << "proto value twice";
    EXPECT_EQ(&core::FamilyOf(row.id), &row);
    EXPECT_EQ(core::FamilyOfProtoValue(row.proto_value), &row);
    ASSERT_FALSE(row.model_types.empty());
    for (const EncoderFamily::ModelType& type : row.model_types) {
      EXPECT_TRUE(model_types.insert(type.name).second) << type.name << " twice";
      EXPECT_EQ(core::FamilyOfModelType(type.name), &row) << type.name;
    }
    EXPECT_TRUE(Named(row.task_prefix));
    const core::TensorNames& names = row.names;
    for (const char* name : {names.word_embeddings, names.layer, names.attention_out,
                             names.attention_norm, names.ffn_out, names.output_norm}) {
      EXPECT_TRUE(Named(name));
    }
    const bool apart = Named(names.query) && Named(names.key) && Named(names.value);
    EXPECT_NE(apart, Named(names.qkv)) << "Q, K and V apart or fused, not both";
    EXPECT_EQ(row.layout == BlockLayout::kFusedQkv, Named(names.qkv));
    const bool gate_and_up = Named(names.ffn_gate) && Named(names.ffn_up);
    EXPECT_NE(gate_and_up, Named(names.ffn_in)) << "one first product or gate and up";
    EXPECT_TRUE(!gate_and_up || row.rotary) << "gate and up only in a gated block";
    EXPECT_EQ(row.rotary, !Named(names.position_embeddings));
    EXPECT_EQ(row.token_types != EncoderFamily::TokenTypes::kNone,
              Named(names.token_types));
    EXPECT_EQ(row.relative_attention_buckets > 0, Named(names.relative_attention_bias));
    EXPECT_EQ(row.norm == core::EncoderSpec::Norm::kRms,
              Named(names.final_norm) && !Named(names.embedding_norm));
    EXPECT_TRUE(Named(names.embedding_norm) || Named(names.final_norm));
    EXPECT_TRUE(!row.pre_ln_names || Named(row.pre_ln_names->final_norm));
    EXPECT_TRUE(!row.has_classifier() || row.classifier.pooler ||
                Named(row.classifier.dense));
    EXPECT_TRUE(!row.has_masked_lm() ||
                (Named(row.masked_lm.norm) && Named(row.masked_lm.decoder)));
    EXPECT_GE(row.default_layers, 1);
    EXPECT_GE(row.default_vocab, 1);
    EXPECT_GE(row.default_max_positions, 1);
    EXPECT_GT(row.default_eps, 0.0);
  }
}

// attention.proto's FAMILY_NOMIC_BERT is the row named NomicBERT, and so on: the one
// enum of the wire and the table's ids agree both ways.
TEST(FamilyTableTest, TheProtoEnumIsTheTables) {
  const google::protobuf::EnumDescriptor* family = v1::EncoderConfig::Family_descriptor();
  size_t served = 0;
  for (int i = 0; i < family->value_count(); ++i) {
    const google::protobuf::EnumValueDescriptor* value = family->value(i);
    if (value->number() == v1::EncoderConfig::FAMILY_UNSPECIFIED) continue;
    const EncoderFamily* row = core::FamilyOfProtoValue(value->number());
    ASSERT_NE(row, nullptr) << value->name() << " has no row";
    std::string wire = absl::AsciiStrToLower(value->name().substr(7));  // "FAMILY_"
    absl::StrReplaceAll({{"_", ""}}, &wire);
    EXPECT_EQ(wire, absl::AsciiStrToLower(row->name)) << value->name();
    ++served;
  }
  EXPECT_EQ(served, core::EncoderFamilies().size());
}

// Each model_type of each row, alone in a small config.json, resolves to its row and to
// a spec the core accepts: the config reader reads the row, rotary families included.
TEST(FamilyTableTest, EveryModelTypeResolvesToItsRow) {
  for (const EncoderFamily& row : core::EncoderFamilies()) {
    for (const EncoderFamily::ModelType& type : row.model_types) {
      SCOPED_TRACE(type.name);
      const std::string json = absl::StrCat(
          R"({"model_type": ")", type.name, R"(", ")", row.hidden_key, R"(": 32, ")",
          row.heads_key, R"(": 4, ")", row.layers_key, R"(": 2, ")", row.ffn_key,
          R"(": 64, "max_position_embeddings": 64, "vocab_size": 100})");
      v1::ModelConfig config;
      config.mutable_encoder();
      ASSERT_TRUE(ResolveEncoderConfig({json, "", ""}, &config).ok())
          << ResolveEncoderConfig({json, "", ""}, &config);
      EXPECT_EQ(config.encoder().family(), row.proto_value);
      auto spec = EncoderSpecFromConfig(config);
      ASSERT_TRUE(spec.ok()) << spec.status();
      EXPECT_EQ(spec->family, row.id);
      EXPECT_EQ(spec->norm_placement, type.placement);
      EXPECT_EQ(spec->norm, row.norm);
      EXPECT_EQ(spec->causal, row.causal);
      EXPECT_EQ(spec->absolute_positions, !row.rotary);
      EXPECT_EQ(spec->layer_attention.size(), row.rotary ? 2u : 0u);
    }
  }
}

std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every golden checkpoint made by tests/tools, through its config.json, the row and
// the loader; together they cover every row.
TEST(FamilyTableTest, EveryGoldenFamilyLoadsThroughItsRow) {
  const std::filesystem::path data = ATTNSERVE_TEST_DATA_DIR;
  const std::map<std::string, core::EncoderSpec::Family> goldens = {
      {"classifier_tiny", core::EncoderSpec::Family::kBert},
      {"megatron_tiny", core::EncoderSpec::Family::kBert},
      {"distilbert_tiny", core::EncoderSpec::Family::kDistilBert},
      {"roberta_tiny", core::EncoderSpec::Family::kRoberta},
      {"electra_reranker_tiny", core::EncoderSpec::Family::kElectra},
      {"mpnet_tiny", core::EncoderSpec::Family::kMpnet},
      {"mpnet_reranker_tiny", core::EncoderSpec::Family::kMpnet},
      {"modernbert_tiny", core::EncoderSpec::Family::kModernBert},
      {"nomic_tiny", core::EncoderSpec::Family::kNomicBert},
      {"qwen2_tiny", core::EncoderSpec::Family::kQwen},
      {"qwen3_tiny", core::EncoderSpec::Family::kQwen},
      {"gte_tiny", core::EncoderSpec::Family::kGte},
  };
  std::set<core::EncoderSpec::Family> covered;
  for (const auto& [folder, family] : goldens) {
    SCOPED_TRACE(folder);
    EncoderFiles files;
    files.config_json = ReadText(data / folder / "config.json");
    v1::ModelConfig config;
    config.mutable_encoder();
    const absl::Status resolved = ResolveEncoderConfig(files, &config);
    ASSERT_TRUE(resolved.ok()) << resolved;
    auto spec = EncoderSpecFromConfig(config);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->family, family);
    auto file =
        core::SafetensorsFile::Read((data / folder / "model.safetensors").string());
    ASSERT_TRUE(file.ok()) << file.status();
    auto weights = core::LoadBertWeights(*file, *spec, core::EncoderPrefix(*file, *spec));
    ASSERT_TRUE(weights.ok()) << weights.status();
    EXPECT_EQ(weights->layers.size(), static_cast<size_t>(spec->num_layers));
    covered.insert(family);
  }
  EXPECT_EQ(covered.size(), core::EncoderFamilies().size());
}

}  // namespace
}  // namespace attnserve::server
