# Turns the kill-summary lines of TestKillLoop (fuzz/killloop_test.go), one per mode, into one
# Markdown table with a total row: what `make crashtest-long` prints at the end.
#
# A line looks like "    killloop_test.go:266: kill-summary mode=flat cycles=125 kills=125
# acked=... loads=... child_loads=... lost=0 wrong=0 io=uring evidence=... seconds=... failed=false".
/kill-summary/ {
	delete f
	for (i = 1; i <= NF; i++) {
		if ((p = index($i, "=")) > 0) {
			f[substr($i, 1, p - 1)] = substr($i, p + 1)
		}
	}
	n++
	mode[n] = f["mode"]; io[n] = f["io"]; ev[n] = f["evidence"]; failed[n] = f["failed"]
	cycles[n] = f["cycles"]; kills[n] = f["kills"]; acked[n] = f["acked"]; loads[n] = f["loads"]
	child[n] = f["child_loads"]; lost[n] = f["lost"]; wrong[n] = f["wrong"]; secs[n] = f["seconds"]
	tc += cycles[n]; tk += kills[n]; ta += acked[n]; tl += loads[n]; tch += child[n]
	tlost += lost[n]; twrong += wrong[n]; ts += secs[n]
	if (failed[n] != "false") bad++
}
END {
	print "| mode | I/O | cycles | kills | blocks acked | loads checked after the kills | loads checked by the children | lost | wrong | feature exercised | s |"
	print "|---|---|---|---|---|---|---|---|---|---|---|"
	for (i = 1; i <= n; i++) {
		e = ev[i]; gsub(",", ", ", e)
		note = failed[i] == "false" ? "" : " (FAILED)"
		printf "| %s%s | %s | %d | %d | %d | %d | %d | %d | %d | %s | %d |\n", mode[i], note, io[i], cycles[i], kills[i], acked[i], loads[i], child[i], lost[i], wrong[i], e, secs[i]
	}
	printf "| **total** | | %d | %d | %d | %d | %d | %d | %d | | %d |\n", tc, tk, ta, tl, tch, tlost, twrong, ts
	if (n == 0) { print "no kill-summary line"; exit 1 }
	if (bad > 0 || tlost > 0 || twrong > 0) exit 1
}
