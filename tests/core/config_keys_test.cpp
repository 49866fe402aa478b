// The config key registry (core/config_keys.cpp): the key table, how each kind of value is parsed and
// written back, null resets of optional keys, origins in messages, YAML files of every shape, and
// awkward strings through the YAML round trip.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "../test_util.h"
#include "tandem/core/config.h"

namespace tandem {
namespace {

using test::error_of;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ConfigKeys, EveryKeyIsDeclaredOnceWithASectionATypeAndADoc) {
  const auto keys = config_keys();
  const auto names = config_key_names();
  ASSERT_EQ(keys.size(), names.size());
  const std::set<std::string> sections = {"model",   "data",    "train", "optim",    "scaler",
                                          "monitor", "offload", "dist",  "placement"};
  std::set<std::string> seen;
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& k = keys[i];
    EXPECT_EQ(k.name, names[i]) << "the two listings disagree in order";
    EXPECT_TRUE(seen.insert(k.name).second) << k.name << " declared twice";
    const auto dot = k.name.find('.');
    ASSERT_NE(dot, std::string::npos) << k.name;
    EXPECT_EQ(k.name.find('.', dot + 1), std::string::npos) << k.name << ": one section, one key";
    EXPECT_TRUE(sections.count(k.name.substr(0, dot))) << k.name;
    EXPECT_FALSE(k.type.empty()) << k.name;
    EXPECT_FALSE(k.doc.empty()) << k.name;
    // Every key reads back a value that sets it again.
    Config c;
    const std::string v = get_config_key(c, k.name);
    EXPECT_EQ(error_of([&] { set_config_key(c, k.name, v); }), "") << k.name << " = '" << v << "'";
    EXPECT_EQ(get_config_key(c, k.name), v) << k.name;
  }
}

TEST(ConfigKeys, TheTypeColumnNamesTheKindOfValue) {
  std::map<std::string, std::string> type;
  for (const auto& k : config_keys()) type[k.name] = k.type;
  EXPECT_EQ(type.at("train.steps"), "int");
  EXPECT_EQ(type.at("train.seed"), "int");
  EXPECT_EQ(type.at("optim.lr"), "float");
  EXPECT_EQ(type.at("train.tf32"), "bool");
  EXPECT_EQ(type.at("train.run_dir"), "string");
  EXPECT_EQ(type.at("model.n_layer"), "int|null");
  EXPECT_EQ(type.at("model.rope_theta"), "float|null");
  EXPECT_EQ(type.at("model.tie_embeddings"), "bool|null");
  EXPECT_EQ(type.at("train.device"), "auto|cpu|cuda|cuda:N");
  // An enum lists the names it writes, not its aliases (raw, llm.c, txt).
  EXPECT_EQ(type.at("data.format"), "auto|nanogpt|llmc|text");
}

TEST(ConfigKeys, IntegersAcceptIntegralFloatsAndRefuseTheRest) {
  Config c;
  set_config_key(c, "train.steps", "1e6");
  EXPECT_EQ(c.train.steps, 1000000);
  set_config_key(c, "train.steps", "-3");
  EXPECT_EQ(c.train.steps, -3) << "ranges are validate_config's";
  set_config_key(c, "model.d_model", "2.048e3");
  EXPECT_EQ(*c.model.d_model, 2048);
  for (const char* bad : {"2.5", "1e19", "99999999999999999999", "ten", "", "5x", "nan"}) {
    const std::string msg = error_of([&] { set_config_key(c, "train.steps", bad); });
    EXPECT_TRUE(contains(msg, std::string("'train.steps' expects an integer, got '") + bad + "'"))
        << bad << ": " << msg;
  }
  EXPECT_EQ(c.train.steps, -3) << "a refused value changed the key";
}

TEST(ConfigKeys, FloatsAreFiniteAndWrittenBackExactly) {
  Config c;
  for (const double x : {0.1, 1.0 / 3, 3e-4, 1e-300, 6.02214076e23, -2.5}) {
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", x);
    set_config_key(c, "optim.lr", text);
    ASSERT_EQ(c.optim.lr, x) << text;
    Config d;
    set_config_key(d, "optim.lr", get_config_key(c, "optim.lr"));
    EXPECT_EQ(std::memcmp(&d.optim.lr, &x, sizeof x), 0) << text << " read back as " << get_config_key(c, "optim.lr");
  }
  for (const char* bad : {"nan", "inf", "-inf", "1e400", "0.1.2", "fast"}) {
    const std::string msg = error_of([&] { set_config_key(c, "optim.lr", bad); });
    EXPECT_TRUE(contains(msg, std::string("'optim.lr' expects a finite number, got '") + bad + "'")) << msg;
  }
}

TEST(ConfigKeys, BooleansTakeTheUsualWordsInAnyCase) {
  Config c;
  for (const char* yes : {"true", "True", "YES", "on", "1"}) {
    c.train.tf32 = false;
    set_config_key(c, "train.tf32", yes);
    EXPECT_TRUE(c.train.tf32) << yes;
    EXPECT_EQ(get_config_key(c, "train.tf32"), "true");
  }
  for (const char* no : {"false", "No", "OFF", "0"}) {
    c.train.tf32 = true;
    set_config_key(c, "train.tf32", no);
    EXPECT_FALSE(c.train.tf32) << no;
    EXPECT_EQ(get_config_key(c, "train.tf32"), "false");
  }
  for (const char* bad : {"2", "y", "", "truee"})
    EXPECT_TRUE(contains(error_of([&] { set_config_key(c, "train.tf32", bad); }), "expects true or false")) << bad;
}

TEST(ConfigKeys, AnUnsignedKeyRefusesNegativeValues) {
  Config c;
  set_config_key(c, "train.seed", "9223372036854775807");
  EXPECT_EQ(c.train.seed, 9223372036854775807ull);
  EXPECT_EQ(get_config_key(c, "train.seed"), "9223372036854775807");
  EXPECT_TRUE(contains(error_of([&] { set_config_key(c, "train.seed", "-1"); }), "'train.seed' must be >= 0, got -1"));
}

TEST(ConfigKeys, OptionalKeysResetOnEveryNullSpelling) {
  for (const char* null_word : {"null", "", "~", "None", "NULL", "preset"}) {
    Config c;
    set_config_key(c, "model.n_layer", "3");
    set_config_key(c, "model.rope_theta", "5e5");
    set_config_key(c, "model.tie_embeddings", "false");
    ASSERT_TRUE(c.model.n_layer && c.model.rope_theta && c.model.tie_embeddings);
    set_config_key(c, "model.n_layer", null_word);
    set_config_key(c, "model.rope_theta", null_word);
    set_config_key(c, "model.tie_embeddings", null_word);
    EXPECT_FALSE(c.model.n_layer.has_value()) << "'" << null_word << "'";
    EXPECT_FALSE(c.model.rope_theta.has_value()) << "'" << null_word << "'";
    EXPECT_FALSE(c.model.tie_embeddings.has_value()) << "'" << null_word << "'";
    EXPECT_EQ(get_config_key(c, "model.n_layer"), "null");
  }
  Config c;
  set_config_key(c, "model.tie_embeddings", "yes");
  EXPECT_EQ(get_config_key(c, "model.tie_embeddings"), "true");
  EXPECT_TRUE(contains(error_of([&] { set_config_key(c, "model.n_layer", "three"); }), "expects an integer"));
  // A null word is a value for a string key, not a reset.
  set_config_key(c, "train.run_dir", "null");
  EXPECT_EQ(c.train.run_dir, "null");
}

TEST(ConfigKeys, MessagesStartWithTheOrigin) {
  Config c;
  EXPECT_EQ(error_of([&] { set_config_key(c, "train.steps", "x", "run.yaml:4"); }),
            "run.yaml:4: 'train.steps' expects an integer, got 'x'");
  EXPECT_EQ(error_of([&] { set_config_key(c, "train.steps", "x"); }), "'train.steps' expects an integer, got 'x'");
  const std::string unknown = error_of([&] { set_config_key(c, "train.stepz", "1", "run.yaml:2"); });
  EXPECT_EQ(unknown.rfind("run.yaml:2: unknown config key 'train.stepz'", 0), 0u) << unknown;
  const std::string far = error_of([&] { set_config_key(c, "qqqqqqqq.zzzzzzzzzz", "1"); });
  EXPECT_TRUE(contains(far, "unknown config key 'qqqqqqqq.zzzzzzzzzz'")) << far;
  EXPECT_TRUE(contains(far, "`tandem config --keys` lists the valid keys")) << "no close key, so the list is named";
  const std::string retired = error_of([&] { set_config_key(c, "train.fault_oom_above_tokens", "8", "old.yaml:3"); });
  EXPECT_EQ(retired.rfind("old.yaml:3: 'train.fault_oom_above_tokens' was removed", 0), 0u) << retired;
}

TEST(ConfigKeys, AnOverrideSplitsAtTheFirstEqualsSign) {
  Config c;
  apply_override(c, "train.run_dir=runs/a=b");
  EXPECT_EQ(c.train.run_dir, "runs/a=b");
  apply_override(c, "data.val_path=");
  EXPECT_EQ(c.data.val_path, "");
  EXPECT_TRUE(contains(error_of([&] { apply_override(c, "=5"); }), "--set expects KEY=VALUE, got '=5'"));
  EXPECT_TRUE(contains(error_of([&] { apply_override(c, "train.steps=x"); }), "--set: 'train.steps' expects"));
}

TEST(ConfigKeys, YamlOfEveryShapeIsReadOrRefusedWithItsLine) {
  Config c;
  load_yaml_config_text(c, "", "empty.yaml");
  load_yaml_config_text(c, "# only a comment\n", "comment.yaml");
  EXPECT_EQ(config_hash(c), config_hash(Config{})) << "an empty file changed the config";
  set_config_key(c, "model.n_layer", "5");
  load_yaml_config_text(c, "model:\n  n_layer:\n", "reset.yaml");
  EXPECT_FALSE(c.model.n_layer.has_value()) << "a key with no value resets an optional key";
  load_yaml_config_text(c, "data:\n  val_path:\n", "s.yaml");
  EXPECT_EQ(c.data.val_path, "");

  std::string msg = error_of([&] { load_yaml_config_text(c, "train:\n  steps: [1, 2]\n", "l.yaml"); });
  EXPECT_TRUE(contains(msg, "l.yaml:2: 'train.steps' expects a single value, got a list")) << msg;
  msg = error_of([&] { load_yaml_config_text(c, "train:\n  stepz: [1, 2]\n", "l.yaml"); });
  EXPECT_TRUE(contains(msg, "unknown config key 'train.stepz'")) << "an unknown key is named before its value: " << msg;
  msg = error_of([&] { load_yaml_config_text(c, "42\n", "s.yaml"); });
  EXPECT_TRUE(contains(msg, "s.yaml: expected a mapping of config keys at the top level")) << msg;
  msg = error_of([&] { load_yaml_config_text(c, "- train.steps\n", "q.yaml"); });
  EXPECT_TRUE(contains(msg, "q.yaml: expected a mapping of config keys at the top level")) << msg;
  msg = error_of([&] { load_yaml_config_text(c, "train:\n  ? [a, b]\n  : 3\n", "k.yaml"); });
  EXPECT_TRUE(contains(msg, "a config key must be a plain name")) << msg;
  msg = error_of([&] { load_yaml_config_text(c, "train:\n  steps: 3\n  seq_len: x\n", "v.yaml"); });
  EXPECT_TRUE(contains(msg, "v.yaml:3: 'train.seq_len' expects an integer")) << msg;
}

TEST(ConfigKeys, AYamlFileIsReadWithItsPathInMessages) {
  test::TempDir dir;
  const std::string path = dir.file("run.yaml");
  { std::ofstream(path) << "train:\n  steps: 12\n  micro_batch: 3\noptim.lr: 2e-3\n"; }
  Config c;
  load_yaml_config(c, path);
  EXPECT_EQ(c.train.steps, 12);
  EXPECT_EQ(c.train.micro_batch, 3);
  EXPECT_EQ(c.optim.lr, 2e-3);
  { std::ofstream(path) << "train:\n  steps: 12\n  micro_batch: many\n"; }
  const std::string msg = error_of([&] { load_yaml_config(c, path); });
  EXPECT_TRUE(contains(msg, path + ":3: 'train.micro_batch' expects an integer")) << msg;
  const std::string missing = error_of([&] { load_yaml_config(c, dir.file("absent.yaml")); });
  EXPECT_TRUE(contains(missing, "cannot read config file '" + dir.file("absent.yaml") + "'")) << missing;
}

// Strings that YAML would read as null, a boolean, a number or a comment survive config_to_yaml.
TEST(ConfigKeys, EveryUnsignedSeedReadsBackAsWritten) {
  for (const char* seed : {"0", "9223372036854775808", "18446744073709551615"}) {
    Config a;
    set_config_key(a, "train.seed", seed);
    EXPECT_EQ(get_config_key(a, "train.seed"), seed);
    Config b;
    load_yaml_config_text(b, config_to_yaml(a), "roundtrip");
    EXPECT_EQ(get_config_key(b, "train.seed"), seed) << "a run resumes from its own config.yaml";
  }
  Config c;
  EXPECT_NE(test::error_of([&] { set_config_key(c, "train.seed", "18446744073709551616"); }).find("below 2^64"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { set_config_key(c, "train.seed", "-1"); }).find("must be >= 0"), std::string::npos);
}

TEST(ConfigKeys, AwkwardStringsSurviveTheYamlRoundTrip) {
  Config a;
  set_config_key(a, "train.run_dir", "null");
  set_config_key(a, "data.path", "a: b #c");
  set_config_key(a, "data.val_path", "~");
  set_config_key(a, "model.preset", "yes");
  set_config_key(a, "monitor.bind", "");
  set_config_key(a, "offload.trace_steps", "5,6");
  set_config_key(a, "model.init_from", "  spaced  ");
  Config b;
  load_yaml_config_text(b, config_to_yaml(a), "roundtrip");
  for (const char* k : {"train.run_dir", "data.path", "data.val_path", "model.preset", "monitor.bind",
                        "offload.trace_steps", "model.init_from"})
    EXPECT_EQ(get_config_key(b, k), get_config_key(a, k)) << k;
  EXPECT_EQ(config_hash(a), config_hash(b));
}

TEST(ConfigKeys, TheHashIsSixteenHexDigitsAndFollowsEveryKey) {
  const Config base;
  const std::string h = config_hash(base);
  ASSERT_EQ(h.size(), 16u);
  EXPECT_EQ(h.find_first_not_of("0123456789abcdef"), std::string::npos) << h;
  EXPECT_EQ(config_hash(Config{}), h);
  for (const char* assignment : {"train.steps=301", "optim.lr=0.00030000000000000003", "model.n_layer=4",
                                 "monitor.bind=0.0.0.0", "train.tf32=false", "dist.pipeline_stages=2"}) {
    Config c;
    apply_override(c, assignment);
    EXPECT_NE(config_hash(c), h) << assignment;
  }
}

}  // namespace
}  // namespace tandem
