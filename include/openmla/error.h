// openmla: the one error type. Every failure an op reports is an openmla::Error whose message
// names the operation, the argument and what was expected, e.g.
//   openmla.dense_decode: argument 'kv_cache': expected last dimension 576, got 512
#pragma once

#include <stdexcept>
#include <string>

namespace openmla {

enum class ErrorKind {
  kInvalidArgument,  // the caller's input breaks the contract; nothing was launched or written
  kNotImplemented,   // valid input, but this build or device has no implementation of it
  kCuda,             // the CUDA runtime reported a failure
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string op, std::string argument, const std::string& detail);

  ErrorKind kind() const { return kind_; }
  const std::string& op() const { return op_; }
  const std::string& argument() const { return argument_; }

 private:
  ErrorKind kind_;
  std::string op_;
  std::string argument_;
};

}  // namespace openmla
