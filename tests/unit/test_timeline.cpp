// The timeline: what an engine's iterations record (every bucket packed,
// reduced and unpacked in that order inside its iteration, every gradient,
// the closing round), that nothing is recorded while it is off or from
// before it started, that a full buffer drops events and counts them, that
// messages are escaped, and its refusals.
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "check.hpp"
#include "fake_transport.hpp"
#include "nncomm/core/bucket_runner.hpp"
#include "nncomm/core/engine.hpp"
#include "nncomm/observability/timeline.hpp"
#include "reference.hpp"

using namespace nncomm;
using namespace unit;

namespace {

// A new file's path, removed with the object.
class TemporaryFile {
public:
  TemporaryFile() {
    char name[] = "/tmp/nncomm_timeline_XXXXXX";
    const int fd = mkstemp(name);
    CHECK(fd >= 0);
    close(fd);
    path_ = name;
  }
  ~TemporaryFile() { std::remove(path_.c_str()); }
  const std::string &path() const { return path_; }

private:
  std::string path_;
};

std::vector<std::string> lines_of(const std::string &path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

bool has(const std::string &line, const std::string &part) {
  return line.find(part) != std::string::npos;
}

// The lines that record events named `name`.
std::vector<std::string> named(const std::vector<std::string> &lines,
                               const std::string &name) {
  std::vector<std::string> out;
  for (const std::string &line : lines) {
    if (has(line, "{\"name\":\"" + name + "\","))
      out.push_back(line);
  }
  return out;
}

// The number after `"key":` in `line`; -1 when there is none.
double number(const std::string &line, const std::string &key) {
  const size_t at = line.find("\"" + key + "\":");
  if (at == std::string::npos)
    return -1;
  return std::strtod(line.c_str() + at + key.size() + 3, nullptr);
}

// The events of one iteration's bucket `bucket` named `name`.
std::string bucket_event(const std::vector<std::string> &lines,
                         const std::string &name, int64_t iteration,
                         size_t bucket) {
  for (const std::string &line : named(lines, name)) {
    if (number(line, "iteration") == iteration &&
        number(line, "bucket") == bucket)
      return line;
  }
  fail(__FILE__, __LINE__,
       "no " + name + " of bucket " + std::to_string(bucket) +
           " in iteration " + std::to_string(iteration));
  return "";
}

double end_of(const std::string &line) {
  return number(line, "ts") + number(line, "dur");
}

} // namespace

TEST(timeline_records_engine_iterations_in_order) {
  TemporaryFile file;
  CHECK_OK(Timeline::start(file.path(), 3));
  CHECK(Timeline::on());
  std::vector<TensorSpec> specs = {{10, DType::kFloat32},
                                   {25, DType::kFloat32},
                                   {30, DType::kFloat32}};
  const std::vector<Bucket> plan = plan_buckets(
      specs, {2, 1, 0}, 20, false, DType::kFloat32, size_t(1) << 40);
  CHECK(plan.size() >= 3);
  FakeWorld world(1);
  std::unique_ptr<FakeTransport> transport = world.transport(0);
  auto runner = std::make_unique<BucketRunner>(
      *transport, std::make_unique<HostArrays>());
  Engine engine(std::move(transport), std::move(runner), specs.size(), 50);
  size_t planned = 0;
  CHECK_OK(engine.add_plan(plan, &planned));
  std::mt19937_64 rng(5);
  const int iterations = 2;
  for (int i = 0; i < iterations; ++i) {
    std::vector<Array> grads;
    for (const TensorSpec &s : specs)
      grads.push_back(random_array(s.dtype, s.count, rng));
    CHECK_OK(engine.begin(0, 1.0f, 1));
    for (size_t t : {2, 1, 0})
      engine.mark_ready(t, grads[t].data(), grads[t].dtype());
    CHECK_OK(engine.finish());
  }
  CHECK_OK(Timeline::stop());
  CHECK(!Timeline::on());

  const std::vector<std::string> lines = lines_of(file.path());
  CHECK_EQ(lines.front(), std::string("["));
  CHECK_EQ(lines.back(), std::string("]"));
  CHECK_CONTAINS(lines[lines.size() - 2], "\"dropped_events\":0}");
  CHECK_CONTAINS(lines[1], "\"args\":{\"name\":\"rank 3\"}");
  CHECK_EQ(named(lines, "thread_name").size(), size_t(7));
  for (const char *track : {"backward", "gradients", "engine", "collectives",
                            "stalls", "device", "async"}) {
    bool found = false;
    for (const std::string &line : named(lines, "thread_name"))
      found = found || has(line, std::string("{\"name\":\"") + track + "\"}");
    CHECK(found);
  }
  const std::vector<std::string> backwards = named(lines, "backward");
  CHECK_EQ(backwards.size(), size_t(iterations));
  CHECK_EQ(named(lines, "close").size(), size_t(iterations));
  CHECK_EQ(named(lines, "wait_engine").size(), size_t(iterations));
  for (const std::string &backward : backwards) {
    const int64_t iteration = static_cast<int64_t>(number(backward,
                                                          "iteration"));
    CHECK_CONTAINS(backward, "\"cat\":\"backward\",\"ph\":\"X\"");
    CHECK_CONTAINS(backward, "\"pid\":3,\"tid\":1,");
    for (size_t t = 0; t < specs.size(); ++t) {
      bool ready = false;
      for (const std::string &line : named(lines, std::to_string(t))) {
        ready = ready || (number(line, "iteration") == iteration &&
                          number(line, "tensor") == t &&
                          has(line, "\"ph\":\"i\""));
      }
      CHECK(ready);
    }
    for (size_t b = 0; b < plan.size(); ++b) {
      const std::string pack = bucket_event(lines, "pack", iteration, b);
      const std::string reduce = bucket_event(lines, "reduce", iteration, b);
      const std::string unpack = bucket_event(lines, "unpack", iteration, b);
      CHECK(number(pack, "ts") >= number(backward, "ts"));
      CHECK(end_of(pack) <= number(reduce, "ts"));
      CHECK(end_of(reduce) <= number(unpack, "ts"));
      CHECK(end_of(unpack) <= end_of(backward));
      CHECK_EQ(number(pack, "bytes"), double(plan[b].count * 4));
      CHECK_CONTAINS(pack, "\"dtype\":\"float32\"");
      CHECK_CONTAINS(pack, "\"cat\":\"engine\",\"ph\":\"X\"");
    }
  }
}

TEST(timeline_records_nothing_while_off_or_from_before_its_start) {
  CHECK(!Timeline::on());
  const Timeline::Clock::time_point before = Timeline::Clock::now();
  TimelineArgs args;
  args.tensor = 7;
  Timeline::instant(Track::kGradients, "while off", args);
  {
    TimelineSpan span(Track::kEngine, "span while off");
    CHECK(!span.on());
  }
  TemporaryFile file;
  CHECK_OK(Timeline::start(file.path(), 0));
  Timeline::complete(Track::kEngine, "began before", before,
                     Timeline::Clock::now(), args);
  { TimelineSpan span(Track::kEngine, "while on"); }
  CHECK_OK(Timeline::stop());
  Timeline::instant(Track::kGradients, "after", args);
  const std::vector<std::string> lines = lines_of(file.path());
  CHECK(named(lines, "while off").empty());
  CHECK(named(lines, "span while off").empty());
  CHECK(named(lines, "began before").empty());
  CHECK(named(lines, "after").empty());
  CHECK_EQ(named(lines, "while on").size(), size_t(1));
}

TEST(timeline_drops_events_when_full_and_counts_them) {
  TemporaryFile file;
  CHECK_OK(Timeline::start(file.path(), 0, 4));
  const int recorded = 5000;
  for (int i = 0; i < recorded; ++i)
    Timeline::instant(Track::kEngine, "x", TimelineArgs());
  CHECK_OK(Timeline::stop());
  const std::vector<std::string> lines = lines_of(file.path());
  const double dropped = number(lines[lines.size() - 2], "dropped_events");
  CHECK(dropped > 0);
  CHECK_EQ(named(lines, "x").size() + static_cast<size_t>(dropped),
           size_t(recorded));
}

TEST(timeline_escapes_messages) {
  TemporaryFile file;
  CHECK_OK(Timeline::start(file.path(), 0));
  TimelineArgs args;
  args.key = "message";
  args.text = "a \"quoted\" \\ path\nand a new line";
  Timeline::instant(Track::kStalls, "stall", args);
  CHECK_OK(Timeline::stop());
  const std::vector<std::string> stalls = named(lines_of(file.path()),
                                                "stall");
  CHECK_EQ(stalls.size(), size_t(1));
  if (!stalls.empty()) {
    CHECK_CONTAINS(stalls[0], "\"cat\":\"stalls\",\"ph\":\"i\"");
    CHECK_CONTAINS(stalls[0], "\"message\":\"a \\\"quoted\\\" \\\\ path"
                              "\\u000aand a new line\"");
  }
}

TEST(timeline_refuses_a_second_start_and_a_file_it_cannot_create) {
  const Status missing = Timeline::start("/nonexistent/dir/timeline.json", 0);
  CHECK_EQ(missing.code(), StatusCode::kInvalidArgument);
  CHECK_CONTAINS(missing.message(), "/nonexistent/dir/timeline.json");
  CHECK(!Timeline::on());
  TemporaryFile file;
  CHECK_OK(Timeline::start(file.path(), 0));
  const Status again = Timeline::start(file.path(), 0);
  CHECK_EQ(again.code(), StatusCode::kRuntimeError);
  CHECK_CONTAINS(again.message(), "already");
  CHECK_OK(Timeline::stop());
  CHECK_OK(Timeline::stop()); // nothing to stop
}
