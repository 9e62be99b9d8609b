// Each rank's stdout and stderr in files of their own, as torchrun's --log-dir with
// --redirects 3 keeps them: DIR/rank{N}.out and DIR/rank{N}.err. Under mpiexec the ranks'
// output is otherwise merged into one stream, where a failing rank's lines are hard to find
// and a long job's are lost with the terminal.
//
// What goes where: every rank's stdout and stderr go to its files; rank 0's stdout and every
// rank's stderr are also copied to where they went before (the terminal, mpiexec's
// forwarding), so rank 0 still prints the run and every rank's warnings and errors still
// reach the terminal; the other ranks' stdout goes to their file only. The files are
// appended to (a restarted job's attempts follow each other), each attempt starting with a
// header line naming the rank, pid, host and time.
//
// How: file descriptors 1 and 2 are replaced (dup2), so whatever writes to them (ferry,
// MPI, UCX, a library's messages) is caught. A copied stream goes through a pipe read by a
// thread that writes each chunk to the file and to the old descriptor. At normal exit
// (atexit) the streams are flushed and the threads drain and stop; output still in a pipe
// when the process is killed is lost for both destinations alike.
//
// Thread safety: call redirect_rank_output once, early (before threads that print start);
// rank_log_files may be called from any thread afterwards.
#pragma once

#include <string>

namespace ferry {

// Throws std::runtime_error naming the folder or file when it cannot be made or opened.
void redirect_rank_output(const std::string& dir, int rank, int world_size);

// "DIR/rank3.out, DIR/rank3.err" for `rank` once redirect_rank_output ran in this process
// (the same folder for every rank), else "".
std::string rank_log_files(int rank);

}  // namespace ferry
