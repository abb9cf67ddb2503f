// Exceptions thrown by the core. The bindings translate them:
//   std::invalid_argument -> ValueError (bad input: shapes, values, options)
//   pygpfast::LinAlgError -> pygpfast.LinAlgError (a numpy.linalg.LinAlgError)
#pragma once

#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

namespace pygpfast {

class LinAlgError : public std::runtime_error {
 public:
  LinAlgError(std::string routine, int info, const std::string& hint)
      : std::runtime_error(routine + " failed (info=" + std::to_string(info) + "): " + hint),
        routine_(std::move(routine)),
        info_(info) {}
  const std::string& routine() const { return routine_; }
  int info() const { return info_; }

 private:
  std::string routine_;
  int info_;
};

// A double with all its significant digits, for error messages.
inline std::string format_value(double v) {
  std::ostringstream os;
  os.precision(std::numeric_limits<double>::digits10);
  os << v;
  return os.str();
}

// Throw std::invalid_argument unless `condition` holds, with the message made of `parts`
// (strings, numbers; doubles with all their digits). The message is built only on failure:
// checks on every call of a hot path cost a comparison, not string formatting.
template <class... Parts>
inline void require(bool condition, const Parts&... parts) {
  if (condition) return;
  std::ostringstream os;
  os.precision(std::numeric_limits<double>::digits10);
  (os << ... << parts);
  throw std::invalid_argument(os.str());
}

}  // namespace pygpfast
