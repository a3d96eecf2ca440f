/*
 * forklease: a C program that leases through libvram and forks, as a
 * program whose worker processes are forks of it would. It opens a lease
 * of SPEC from the broker on SOCKET, allocates 1 MiB through it, forks a
 * child that sleeps without exec (and so without close-on-exec), prints
 * "parent=PID child=PID", and waits to be killed. libvram's
 * TestForkedChildDropsLease kills the parent and watches the broker.
 *
 *	forklease LIBVRAM SPEC SOCKET
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

#include "../vram.h"

int main(int argc, char **argv) {
	if (argc != 4) {
		fprintf(stderr, "usage: forklease LIBVRAM SPEC SOCKET\n");
		return 2;
	}
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		printf("err dlopen: %s\n", dlerror());
		return 1;
	}
	int (*open_lease)(const char *, const char *, const char *, double, uint64_t, vram_manager *) = dlsym(lib, "vram_open_lease");
	int (*alloc)(vram_manager, int, size_t, vram_stream, void **) = dlsym(lib, "vram_alloc");
	size_t (*last_error)(char *, size_t) = dlsym(lib, "vram_last_error");
	char msg[512];
	vram_manager m = 0;
	void *p = NULL;
	if (open_lease(argv[2], argv[3], "forklease", 0, 0, &m) != VRAM_OK || alloc(m, VRAM_SOURCE_C, 1 << 20, VRAM_STREAM_UNORDERED, &p) != VRAM_OK) {
		last_error(msg, sizeof msg);
		printf("err %s\n", msg);
		return 1;
	}
	pid_t child = fork();
	if (child < 0) {
		printf("err fork\n");
		return 1;
	}
	if (child == 0)
		for (;;) pause();
	printf("parent=%d child=%d\n", (int)getpid(), (int)child);
	fflush(stdout);
	for (;;) pause();
}
