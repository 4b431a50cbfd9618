// A data set's directory as it is written: OUT.partial-PID first, renamed to OUT when complete,
// so that nothing interrupted looks like a data set (troupe data prepare, troupe data import).
#pragma once

#include <mutex>
#include <string>

namespace troupe::data {

// OUT without its trailing slashes ("runs/x/": its partial is a sibling, not a child): the name
// of a new directory this process may create. std::invalid_argument naming --out when it is
// empty, "." or "..", exists (a data set is written once), or its nearest existing parent is not
// a directory this process may write in.
std::string new_set_directory(const std::string& out);

// Creates OUT.partial-PID (its parents too), first removing the partial directories of
// processes that are gone (an interrupted prepare's or import's); its path.
std::string make_partial(const std::string& out);

// fsync of a file or a directory: std::runtime_error naming it when it fails.
void sync_path(const std::string& path);

// The finished partial directory renamed to OUT, which must still not exist (not even empty: it
// appeared meanwhile). Held while it is renamed, `published` set under it: a signal's handler
// that takes `publishing` knows whether OUT is whole or the partial directory is to go.
void publish(const std::string& partial, const std::string& out, std::mutex* publishing,
             bool* published);

}  // namespace troupe::data
