/*
 * scenario.h: the scenario model shared by the parser (scenario.c) and the
 * fake NVML entry points (nvml.c). See README.md for the file format.
 *
 * Everything declared here is hidden in the shared library, so that a
 * process that links the parser itself (the Go test binary, which exports
 * its symbols dynamically) can never interpose on the library's copy.
 */
#ifndef FAKENVML_SCENARIO_H
#define FAKENVML_SCENARIO_H

#include <stddef.h>
#include <stdint.h>

#define FAKE_HIDDEN __attribute__((visibility("hidden")))

#define FAKE_MAX_DEVICES 64      /* devices per scenario */
#define FAKE_MAX_LINKS 36        /* NVML_NVLINK_MAX_LINKS */
#define FAKE_NUM_COUNTERS 5      /* NVML_NVLINK_ERROR_DL_REPLAY .. DL_ECC_DATA */
#define FAKE_MAX_OPS 65536       /* directives other than device, all told */
#define FAKE_MAX_LINE 1024       /* bytes per line, without the newline */
#define FAKE_UUID_SIZE 96        /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define FAKE_NAME_SIZE 96        /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define FAKE_CLUSTER_LEN 16      /* NVML_GPU_FABRIC_UUID_LEN */

enum fake_op_kind {
	FAKE_OP_XID,          /* value = XID code */
	FAKE_OP_LOST,         /* the device falls off the bus */
	FAKE_OP_COUNTER_SET,  /* counter = value from at on */
	FAKE_OP_COUNTER_RAMP, /* counter grows by rate/s during [at, at+for) */
	FAKE_OP_LINKSTATE,    /* state: 1 up, 0 down */
	FAKE_OP_FABRIC,       /* state, health, status, clique, mask, cluster */
	FAKE_OP_CLOCKS,       /* value = clocks event reasons; num[SM], num[SM_MAX] */
	FAKE_OP_PCIE,         /* num[GEN], num[WIDTH], num[MAX_GEN], num[MAX_WIDTH], num[GPU_MAX_GEN] */
	FAKE_OP_UTIL,         /* num[GPU], num[MEMORY] in percent */
	FAKE_OP_REMAP,        /* num[CORR], num[UNCORR], num[PENDING], num[FAILURE] */
	FAKE_OP_RETIRED,      /* state: pages pending retirement */
	FAKE_OP_TEMP,         /* num[TEMP_GPU], num[SLOWDOWN], num[SHUTDOWN] in degrees C */
	FAKE_OP_NVLINK_SPEED  /* link; num[MBPS] */
};

/*
 * Counters other than the NVLink ones reuse the counter ops (value= and
 * rate=) on a pseudo link past the last real one.
 */
#define FAKE_LINK_PCIE_REPLAY FAKE_MAX_LINKS       /* counter 0: PCIe replays */
#define FAKE_LINK_ECC (FAKE_MAX_LINKS + 1)         /* counter 0: volatile uncorrected ECC */

/* Indexes into fake_op.num. */
enum {
	FAKE_SM = 0, FAKE_SM_MAX = 1,
	FAKE_GEN = 0, FAKE_WIDTH = 1, FAKE_MAX_GEN = 2, FAKE_MAX_WIDTH = 3, FAKE_GPU_MAX_GEN = 4,
	FAKE_UTIL_GPU = 0, FAKE_UTIL_MEMORY = 1,
	FAKE_CORR = 0, FAKE_UNCORR = 1, FAKE_PENDING = 2, FAKE_FAILURE = 3,
	FAKE_TEMP_GPU = 0, FAKE_SLOWDOWN = 1, FAKE_SHUTDOWN = 2,
	FAKE_MBPS = 0,
	FAKE_NUMS = 5
};

/* A point in time: ns after nvmlInit, or (absolute) ns since the Unix epoch. */
struct fake_time {
	int absolute;
	int64_t ns;
};

#define FAKE_VERSION_SIZE 32 /* NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE, INFOROM 16 */
#define FAKE_DRIVER_SIZE 80  /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */

struct fake_device {
	char uuid[FAKE_UUID_SIZE];
	char name[FAKE_NAME_SIZE];
	unsigned domain, bus, dev, function;
	unsigned links;
	/* Inventory: what nvidia-smi -q shows; a mode of -1 is "not supported". */
	char vbios[FAKE_VERSION_SIZE];
	char inforom[FAKE_VERSION_SIZE];
	int ecc, persistence, mig;
	unsigned power_w;
};

struct fake_op {
	int kind; /* enum fake_op_kind */
	int device;
	int link;
	int counter;
	struct fake_time at;
	int64_t for_ns; /* ramp length; -1 means forever */
	uint64_t value;
	double rate; /* per second */
	int state;
	int health;
	uint32_t status, clique, mask;
	unsigned char cluster[FAKE_CLUSTER_LEN];
	uint32_t num[FAKE_NUMS];
	uint64_t delivered; /* runtime: bit i set once event set slot i got it */
};

struct fake_scenario {
	struct fake_device devices[FAKE_MAX_DEVICES];
	int ndevices;
	/* system line: the driver's version and the CUDA version it supports. */
	char driver[FAKE_DRIVER_SIZE];
	unsigned cuda;
	struct fake_op *ops;
	size_t nops, capops;
	int live;     /* set after nvmlInit: device lines are refused */
	int skipping; /* inside an over-long line that has no newline yet */
	int log;      /* print each rejected line to stderr */
	long lineno;
	long directives; /* lines accepted */
	long errors;     /* lines rejected */
	char first_error[192];
};

FAKE_HIDDEN void fake_scenario_init(struct fake_scenario *s);
FAKE_HIDDEN void fake_scenario_free(struct fake_scenario *s);

/*
 * fake_parse parses the complete lines in buf[0:len) and returns how many
 * bytes it consumed. A trailing line without a newline is left for the next
 * call unless final is set. Bytes may be anything, NUL included.
 */
FAKE_HIDDEN size_t fake_parse(struct fake_scenario *s, const char *buf, size_t len, int final);

/* fake_add_op appends a zeroed op, or returns NULL when FAKE_MAX_OPS is reached. */
FAKE_HIDDEN struct fake_op *fake_add_op(struct fake_scenario *s);

/* fake_parse_pci parses [[domain:]bus:device[.function]] in hex; 0 on success. */
FAKE_HIDDEN int fake_parse_pci(const char *p, size_t n, unsigned *domain, unsigned *bus,
			       unsigned *dev, unsigned *function);

#endif
