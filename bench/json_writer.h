// openmla-bench: a minimal streaming JSON writer (objects, arrays, strings, numbers, null),
// enough for the results file; non-finite numbers are written as null, as JSON has no NaN.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace openmla::bench {

class JsonWriter {
 public:
  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  JsonWriter& end_array() { return close(']'); }

  JsonWriter& key(const std::string& name) {
    separate();
    quote(name);
    text_ += ": ";
    after_key_ = true;
    return *this;
  }
  JsonWriter& value(const std::string& text) {
    separate();
    quote(text);
    return *this;
  }
  JsonWriter& value(const char* text) { return value(std::string(text)); }
  JsonWriter& value(double number) {
    separate();
    if (!std::isfinite(number)) {
      text_ += "null";
    } else {
      char buffer[32];
      std::snprintf(buffer, sizeof(buffer), "%.6g", number);
      text_ += buffer;
    }
    return *this;
  }
  // key + value in one call.
  template <typename T>
  JsonWriter& field(const std::string& name, const T& field_value) {
    return key(name).value(field_value);
  }

  const std::string& text() const { return text_; }

 private:
  JsonWriter& open(char bracket) {
    separate();
    text_ += bracket;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& close(char bracket) {
    first_.pop_back();
    newline();
    text_ += bracket;
    return *this;
  }
  // Before a value or key: a comma unless it is the first in its container; a value right
  // after its key goes on the same line.
  void separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (first_.empty()) return;
    if (!first_.back()) text_ += ',';
    first_.back() = false;
    newline();
  }
  void newline() {
    text_ += '\n';
    text_.append(2 * first_.size(), ' ');
  }
  void quote(const std::string& raw) {
    text_ += '"';
    for (char c : raw) {
      switch (c) {
        case '"': text_ += "\\\""; break;
        case '\\': text_ += "\\\\"; break;
        case '\n': text_ += "\\n"; break;
        case '\t': text_ += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
            text_ += escaped;
          } else {
            text_ += c;
          }
      }
    }
    text_ += '"';
  }

  std::string text_;
  std::vector<bool> first_;  // per open container: nothing written in it yet
  bool after_key_ = false;
};

}  // namespace openmla::bench
