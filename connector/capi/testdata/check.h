// check.h: what the C test programs (abi.c, retrieve.c, selector.c) share: a failure count and
// checks that report the file, the line and the library's last error, and go on.
#ifndef UCMGO_TEST_CHECK_H
#define UCMGO_TEST_CHECK_H

#include <stdio.h>
#include <string.h>

#include "ucmgo.h"

static int failures;

#define CHECK(cond, ...)                                                \
	do {                                                                \
		if (!(cond)) {                                                  \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
			fprintf(stderr, __VA_ARGS__);                               \
			fprintf(stderr, " (last error: %s)\n", ucmgo_last_error()); \
			failures++;                                                 \
		}                                                               \
	} while (0)

// A status and a message naming want.
#define EXPECT_STATUS(got, status, want)                                                  \
	do {                                                                                  \
		long long g_ = (long long)(got);                                                  \
		CHECK(g_ == (status), "status %lld, want %d", g_, (status));                      \
		CHECK(strstr(ucmgo_last_error(), (want)) != NULL, "message lacks \"%s\"", (want)); \
	} while (0)

#endif
