// ringsample: what a process's I/O is waiting on, sampled from outside (Linux, root).
//
//   gcc -O2 -o ringsample tools/ringsample/ringsample.c
//   ringsample PID OUT [PERIOD_US] [DEVICE]
//
// Every PERIOD_US (default 500) until PID exits, at real-time priority (SCHED_FIFO 50, so the
// samples keep their period while the process saturates the CPUs), one line to OUT:
//
//   t_us dev_reads dev_writes ring_kernel ring_unreaped running blocked cpu_us runq_us
//   user_jiffies sys_jiffies idle_jiffies steal_jiffies hw_stopped hw_dispatch [tid:wchan ...]
//
//   dev_*          requests in flight in the block device (/sys/block/DEVICE/inflight; vda)
//   ring_kernel    SQEs the kernel holds: submitted, not yet completed (SqHead - CqTail summed
//                  over the process's io_uring descriptors, found once they exist)
//   ring_unreaped  completions posted to the CQ and not yet consumed (CqTail - CqHead)
//   running        the process's threads in state R; blocked: in state D, each listed at the
//                  end with the kernel function it waits in
//   cpu_us runq_us cumulative on-CPU and run-queue-wait time of its threads (schedstat)
//   *_jiffies      the machine's cumulative CPU time (/proc/stat)
//   hw_stopped     1 while the device's first hardware queue is stopped (the driver found no
//                  room for the next request: a virtio ring out of descriptors), else 0;
//   hw_dispatch    requests the block layer holds for it meanwhile. Both from debugfs
//                  (/sys/kernel/debug/block/DEVICE/hctx0/{state,dispatch}; mount -t debugfs
//                  none /sys/kernel/debug), -1 when it is not mounted
//
// Reading /proc for every thread costs the machine about a tenth of a CPU at 500 us.
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long now_us(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000L + t.tv_nsec / 1000;
}

// readall reads up to n-1 bytes of path into b, NUL-terminated; -1 if it cannot.
static int readall(const char *path, char *b, int n) {
	int fd = open(path, O_RDONLY);
	if (fd < 0) return -1;
	int k = read(fd, b, n - 1);
	close(fd);
	if (k < 0) return -1;
	b[k] = 0;
	return k;
}

// field returns the number after name in b (0 when absent).
static unsigned long field(const char *b, const char *name) {
	const char *s = strstr(b, name);
	return s ? strtoul(s + strlen(name), NULL, 10) : 0;
}

int main(int argc, char **argv) {
	if (argc < 3) {
		fprintf(stderr, "usage: ringsample PID OUT [PERIOD_US] [DEVICE]\n");
		return 2;
	}
	int pid = atoi(argv[1]);
	long period = argc > 3 ? atol(argv[3]) : 500;
	const char *dev = argc > 4 ? argv[4] : "vda";
	struct sched_param sp = {.sched_priority = 50};
	if (sched_setscheduler(0, SCHED_FIFO, &sp) != 0) perror("ringsample: SCHED_FIFO (sampling at normal priority)");
	FILE *out = fopen(argv[2], "w");
	if (out == NULL) {
		perror(argv[2]);
		return 1;
	}
	char path[512], buf[8192], link[256], inflight[128], hwstate[128], hwdispatch[128];
	snprintf(inflight, sizeof inflight, "/sys/block/%s/inflight", dev);
	snprintf(hwstate, sizeof hwstate, "/sys/kernel/debug/block/%s/hctx0/state", dev);
	snprintf(hwdispatch, sizeof hwdispatch, "/sys/kernel/debug/block/%s/hctx0/dispatch", dev);
	int rings[16], nrings = 0;
	long t0 = now_us();
	for (long t = 0;; t = now_us() - t0) {
		snprintf(path, sizeof path, "/proc/%d", pid);
		if (access(path, F_OK) != 0) break;
		if (nrings == 0) {
			snprintf(path, sizeof path, "/proc/%d/fd", pid);
			DIR *d = opendir(path);
			for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL && nrings < 16;) {
				snprintf(path, sizeof path, "/proc/%d/fd/%s", pid, e->d_name);
				int k = readlink(path, link, sizeof link - 1);
				if (k <= 0) continue;
				link[k] = 0;
				if (strstr(link, "io_uring") != NULL) rings[nrings++] = atoi(e->d_name);
			}
			if (d != NULL) closedir(d);
		}
		unsigned long dr = 0, dw = 0;
		if (readall(inflight, buf, sizeof buf) > 0) sscanf(buf, "%lu %lu", &dr, &dw);
		int stopped = -1, dispatch = -1;
		if (readall(hwstate, buf, sizeof buf) >= 0) stopped = strstr(buf, "STOPPED") != NULL;
		if (readall(hwdispatch, buf, sizeof buf) >= 0) {
			dispatch = 0;
			for (const char *c = buf; *c; c++) dispatch += *c == '\n';
		}
		long kernel = 0, unreaped = 0;
		for (int i = 0; i < nrings; i++) {
			snprintf(path, sizeof path, "/proc/%d/fdinfo/%d", pid, rings[i]);
			if (readall(path, buf, sizeof buf) <= 0) continue;
			unsigned long sqh = field(buf, "\nSqHead:"), cqh = field(buf, "\nCqHead:"), cqt = field(buf, "\nCqTail:");
			kernel += (long)(unsigned)(sqh - cqt);
			unreaped += (long)(unsigned)(cqt - cqh);
		}
		int running = 0, blocked = 0, dl = 0;
		unsigned long long oncpu = 0, runq = 0;
		char dlist[1024] = "";
		snprintf(path, sizeof path, "/proc/%d/task", pid);
		DIR *d = opendir(path);
		for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
			if (e->d_name[0] == '.') continue;
			snprintf(path, sizeof path, "/proc/%d/task/%s/schedstat", pid, e->d_name);
			if (readall(path, buf, sizeof buf) > 0) {
				unsigned long long c = 0, q = 0;
				sscanf(buf, "%llu %llu", &c, &q);
				oncpu += c;
				runq += q;
			}
			snprintf(path, sizeof path, "/proc/%d/task/%s/stat", pid, e->d_name);
			if (readall(path, buf, sizeof buf) <= 0) continue;
			char *p = strrchr(buf, ')');
			if (p == NULL || p[1] == 0 || p[2] == 0) continue;
			if (p[2] == 'R') running++;
			if (p[2] != 'D') continue;
			blocked++;
			char wchan[128] = "";
			snprintf(path, sizeof path, "/proc/%d/task/%s/wchan", pid, e->d_name);
			readall(path, wchan, sizeof wchan);
			if (dl < 900) dl += snprintf(dlist + dl, sizeof dlist - dl, " %s:%s", e->d_name, wchan);
		}
		if (d != NULL) closedir(d);
		unsigned long long u = 0, ni = 0, s = 0, idle = 0, iow = 0, irq = 0, sirq = 0, steal = 0;
		if (readall("/proc/stat", buf, sizeof buf) > 0)
			sscanf(buf, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &u, &ni, &s, &idle, &iow, &irq, &sirq, &steal);
		fprintf(out, "%ld %lu %lu %ld %ld %d %d %llu %llu %llu %llu %llu %llu %d %d%s\n", t, dr, dw, kernel, unreaped, running,
			blocked, oncpu / 1000, runq / 1000, u + ni, s + irq + sirq, idle + iow, steal, stopped, dispatch, dlist);
		long wait = t0 + t + period - now_us();
		if (wait > 0) usleep(wait);
	}
	fclose(out);
	return 0;
}
