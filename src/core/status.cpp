#include "flashgrad/status.h"

namespace flashgrad {

[[noreturn]] void throw_invalid_argument(const std::string& op, const std::string& argument,
                                         const std::string& rule) {
  throw Error(ErrorKind::invalid_argument, argument,
              "flashgrad: " + op + ": argument '" + argument + "': " + rule);
}

[[noreturn]] void throw_unsupported(const std::string& op, const std::string& argument,
                                    const std::string& what) {
  throw Error(ErrorKind::unsupported, argument,
              "flashgrad: " + op + ": argument '" + argument + "': " + what);
}

}  // namespace flashgrad
