// Errors, in two tiers (STYLE.md).
//
// Contract violations inside Lattice: LATTICE_CHECK(cond, "fmt", args...) and the
// LATTICE_CHECK_EQ/NE/LT/LE/GT/GE family, which report file, line, the condition and both
// operands. They are always on (never compiled out under NDEBUG).
//
// Runtime failures caused by input, files, peers or time: the typed exceptions below, thrown
// with LATTICE_THROW(Type, "fmt", args...). Their message names the thing that failed and,
// where there is one, the fix ("... ---> HINT: ...").
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace lattice {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A broken internal invariant: a bug in Lattice or a misuse of its API.
class ContractError : public Error {
  using Error::Error;
};
class ShapeError : public Error {
  using Error::Error;
};
class DTypeError : public Error {
  using Error::Error;
};
class ValueError : public Error {
  using Error::Error;
};
class IoError : public Error {
  using Error::Error;
};
class ConfigError : public Error {
  using Error::Error;
};
class TimeoutError : public Error {
  using Error::Error;
};
class CommError : public Error {
  using Error::Error;
};
class OutOfMemoryError : public Error {
  using Error::Error;
};

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               const std::string& message = {});
[[noreturn]] void check_op_failed(const char* file, int line, const char* expression,
                                  const std::string& lhs, const std::string& rhs,
                                  const std::string& message = {});
}  // namespace detail

}  // namespace lattice

#define LATTICE_CHECK(cond, ...)                                                       \
  do {                                                                                 \
    if (!(cond)) [[unlikely]] {                                                        \
      ::lattice::detail::check_failed(__FILE__, __LINE__,                              \
                                      #cond __VA_OPT__(, ::fmt::format(__VA_ARGS__))); \
    }                                                                                  \
  } while (0)

#define LATTICE_CHECK_OP_(a, b, op, ...)                                               \
  do {                                                                                 \
    const auto& lattice_lhs_ = (a);                                                    \
    const auto& lattice_rhs_ = (b);                                                    \
    if (!(lattice_lhs_ op lattice_rhs_)) [[unlikely]] {                                \
      ::lattice::detail::check_op_failed(                                              \
          __FILE__, __LINE__, #a " " #op " " #b, ::fmt::format("{}", lattice_lhs_),    \
          ::fmt::format("{}", lattice_rhs_) __VA_OPT__(, ::fmt::format(__VA_ARGS__))); \
    }                                                                                  \
  } while (0)

#define LATTICE_CHECK_EQ(a, b, ...) LATTICE_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define LATTICE_CHECK_NE(a, b, ...) LATTICE_CHECK_OP_(a, b, !=, __VA_ARGS__)
#define LATTICE_CHECK_LT(a, b, ...) LATTICE_CHECK_OP_(a, b, <, __VA_ARGS__)
#define LATTICE_CHECK_LE(a, b, ...) LATTICE_CHECK_OP_(a, b, <=, __VA_ARGS__)
#define LATTICE_CHECK_GT(a, b, ...) LATTICE_CHECK_OP_(a, b, >, __VA_ARGS__)
#define LATTICE_CHECK_GE(a, b, ...) LATTICE_CHECK_OP_(a, b, >=, __VA_ARGS__)

// Throws a typed runtime error: LATTICE_THROW(IoError, "cannot open {}: {}", path, why).
#define LATTICE_THROW(Type, ...) throw ::lattice::Type(::fmt::format(__VA_ARGS__))
