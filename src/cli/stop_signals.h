// SIGTERM / SIGINT as a request to stop: while a StopSignals lives, either signal only sets a
// flag that generation loops check between tokens, so the current token is finished, the
// summary printed and the command exits 0 (what `sluice watchdog` asks for at its soft limit).
// SA_RESETHAND: a second signal takes the default action, so a stuck run can still be killed.
#pragma once

#include <signal.h>

namespace sluice::cli {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static int raised();  // the signal received, 0 for none

 private:
  struct sigaction old_term_ {}, old_int_ {};
};

const char* signal_name(int sig);

}  // namespace sluice::cli
