#include "core/error.h"

namespace lattice::detail {

void check_failed(const char* file, int line, const char* condition, const std::string& message) {
  std::string text = fmt::format("{}:{}: check failed: {}", file, line, condition);
  if (!message.empty()) text += fmt::format(" ({})", message);
  throw ContractError(text);
}

void check_op_failed(const char* file, int line, const char* expression, const std::string& lhs,
                     const std::string& rhs, const std::string& message) {
  std::string text = fmt::format("{}:{}: check failed: {} (left: {}, right: {})", file, line,
                                 expression, lhs, rhs);
  if (!message.empty()) text += fmt::format(": {}", message);
  throw ContractError(text);
}

}  // namespace lattice::detail
