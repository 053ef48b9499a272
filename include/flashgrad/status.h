// flashgrad: errors.
//
// Every entry point validates its arguments before touching any output. A broken rule becomes a
// flashgrad::Error whose message names the argument and the rule, e.g.
//   "flashgrad: attention_forward: argument 'cu_seqlens_q': must be non-decreasing (entry 3 = 7 < entry 2 = 9)"
// CUDA failures become the same type with the failing call and the driver's error text.
#pragma once

#include <stdexcept>
#include <string>

namespace flashgrad {

enum class ErrorKind {
  invalid_argument,  // the caller broke a documented rule (maps to ValueError in Python)
  unsupported,       // valid, but not implemented by the chosen backend (NotImplementedError)
  backend_failure,   // a CUDA call or allocation failed (RuntimeError)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string argument, const std::string& message)
      : std::runtime_error(message), kind_(kind), argument_(std::move(argument)) {}

  ErrorKind kind() const noexcept { return kind_; }
  // The argument that broke a rule ("" when the error is not about one argument).
  const std::string& argument() const noexcept { return argument_; }

 private:
  ErrorKind kind_;
  std::string argument_;
};

// Builds "flashgrad: <op>: argument '<arg>': <rule>" and throws it as ErrorKind::invalid_argument.
[[noreturn]] void throw_invalid_argument(const std::string& op, const std::string& argument,
                                         const std::string& rule);
// Same shape of message, ErrorKind::unsupported.
[[noreturn]] void throw_unsupported(const std::string& op, const std::string& argument,
                                    const std::string& what);

}  // namespace flashgrad
