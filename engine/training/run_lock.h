// One run per checkpoint folder: an exclusive flock(2) on `DIR/.lock`, held for the life of the
// run that writes checkpoints there (train, train --resume).
//
// Two runs writing one folder interleave their checkpoints: one deletes the other's .tmp-step_*
// folder mid-write, prunes its steps, or leaves step_* folders of two different runs side by side.
// A scheduler that restarts a job while the old one still runs does exactly that, so the second
// run is refused at once (exit 2), and told which process holds the folder.
//
// The kernel drops a flock with the last descriptor of the process that took it, so a lock left by
// a SIGKILLed or crashed run (or a node that rebooted) never blocks the resume that follows; the
// lock file is not deleted while a run may need it: a run that locked a file checks that the path
// still names it (and starts over when not), so the one deletion there is, below, cannot let two
// runs lock two different inodes. It holds
// the holder's pid, host and start time, only for the refusal message. On NFS, Linux turns flock
// into an NLM byte-range lock, which holds across clients when the mount has locking (the
// default; not with `nolock`), and the server drops it when the client that held it is gone.
// A file system that has no locks at all (flock fails with ENOLCK or EOPNOTSUPP) runs unguarded,
// with a warning.
//
// A run that created the folder and leaves nothing in it but the lock (it was refused before its
// first checkpoint: a missing data file, a config error) removes the lock and the folders it
// created, while it still holds the lock: a refused run leaves no trace.
#pragma once

#include <string>
#include <vector>

namespace remat {

class RunLock {
 public:
  /// Creates `dir` if needed and locks `dir`/.lock. Throws CheckpointError (exit 2) naming the
  /// folder, the holder (pid, host, start time) and the fix when another process holds it.
  explicit RunLock(const std::string& folder);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  /// Non-empty when the file system cannot lock: the run goes on unguarded, and says so.
  const std::string& warning() const { return warning_; }
  /// The lock file (`dir`/.lock).
  const std::string& path() const { return path_; }

 private:
  enum class Outcome {
    Locked,     // fd_ holds the lock (on the file the path named when it was opened)
    Unguarded,  // the file system has no locks: warning_ says so
    Vanished,   // the folder was removed before the file could be opened: try again
  };
  /// Creates the folder, opens and flocks the lock file; throws when another run holds it.
  Outcome lock(const std::string& dir);

  std::string path_;
  int fd_ = -1;
  std::string warning_;
  std::vector<std::string> created_;  // the folders this lock created, outermost first
};

/// Who holds the lock file `path` per its contents ("pid 123 on host n1, started ..."), or a
/// note that it has not written them yet.
std::string run_lock_holder(const std::string& path);

}  // namespace remat
