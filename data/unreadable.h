// A data set's file that this process could not open or read for a reason of its own or of the
// host (too many open files, no memory, no permission), not of the data: the set may be sound,
// and preparing it again would not help. `troupe data verify` says so (exit 2), not "damaged".
#pragma once

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe::data {

class Unreadable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Whether an errno of open or read is the process's or the host's, not the file's.
inline bool not_the_data(int error) {
  return error == EMFILE || error == ENFILE || error == ENOMEM || error == ENOBUFS ||
         error == EACCES || error == EPERM;
}

// After an open or a read failed with `error`: Unreadable ("WHAT here: its text") where that is
// the process's, else nothing (the caller says what is wrong with the file).
inline void unreadable_if_not_the_data(int error, const std::string& what) {
  if (not_the_data(error)) throw Unreadable(what + " here: " + std::strerror(error));
}

}  // namespace troupe::data
