#define _GNU_SOURCE
// SIGSEGV/SIGBUS/SIGABRT handler, LD_PRELOADed by bench/gpu/diag/exit.sh: prints the native
// stack (library + offset) of the crashing thread, since the device has no gdb.
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include <dlfcn.h>
#include <stdio.h>
static void on_segv(int sig, siginfo_t *si, void *uc) {
  void *bt[64]; int n = backtrace(bt, 64);
  char buf[256]; int l = snprintf(buf, sizeof buf, "\n=== SIGNAL %d addr %p thread %d, %d frames\n", sig, si->si_addr, gettid(), n);
  write(2, buf, l);
  for (int i = 0; i < n; i++) {
    Dl_info info; memset(&info, 0, sizeof info);
    if (dladdr(bt[i], &info) && info.dli_fname) {
      l = snprintf(buf, sizeof buf, "  #%d %s+0x%lx %s\n", i, info.dli_fname, (unsigned long)((char*)bt[i] - (char*)info.dli_fbase), info.dli_sname ? info.dli_sname : "?");
    } else l = snprintf(buf, sizeof buf, "  #%d %p\n", i, bt[i]);
    write(2, buf, l);
  }
  _exit(139);
}
__attribute__((constructor)) static void init(void) {
  static char stack[1 << 16]; stack_t ss = { .ss_sp = stack, .ss_size = sizeof stack };
  sigaltstack(&ss, 0);
  struct sigaction sa; memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv; sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, 0); sigaction(SIGBUS, &sa, 0); sigaction(SIGABRT, &sa, 0);
}
