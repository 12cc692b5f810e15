/* The pod sandbox's init process (the CRI "pause" container), written for meshrun's local real
 * node because no image can be pulled here. Like Kubernetes' build/pause/linux/pause.c it holds
 * the pod's namespaces open, exits cleanly on SIGINT/SIGTERM, and reaps zombies when it is PID 1
 * of a shared PID namespace. Built static: the image holds only this binary. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int signo) {
  (void)signo;
  _exit(0);
}

static void on_child(int signo) {
  (void)signo;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("meshrun pause 3.10");
    return 0;
  }
  if (getpid() != 1) {
    fputs("warning: pause should be the first process\n", stderr);
  }
  struct sigaction stop = {.sa_handler = on_stop};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    perror("sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
  return 42; /* unreachable */
}
