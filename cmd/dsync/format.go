package main

// Formatting: what inspect and list print, as text for people or as JSON.

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
)

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// fmtMillis formats a duration in ms, "-" for none (< 0).
func fmtMillis(ms int64) string {
	if ms < 0 {
		return "-"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

// fmtFence formats a fencing token, "-" for none (0).
func fmtFence(f uint64) string {
	if f == 0 {
		return "-"
	}
	return strconv.FormatUint(f, 10)
}

// writeState prints one primitive in full.
func writeState(w io.Writer, st *lockState) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	mode := st.Mode
	if mode == "" {
		mode = "-"
	}
	fmt.Fprintf(tw, "name\t%s\n", st.Name)
	fmt.Fprintf(tw, "key\t%s\n", st.Key)
	fmt.Fprintf(tw, "mode\t%s\n", mode)
	fmt.Fprintf(tw, "state\t%s\n", st.State)
	if st.Size > 0 {
		fmt.Fprintf(tw, "permits\t%d of %d used\n", st.Used, st.Size)
	}
	for _, h := range st.Holders {
		what := fmt.Sprintf("count %d", h.Count)
		if st.Mode == "semaphore" {
			what = fmt.Sprintf("%d permits", h.Count)
		}
		if h.Kind != "" {
			what = h.Kind + ", " + what
		}
		if h.TTLMillis > 0 {
			what += ", lease " + fmtMillis(h.TTLMillis)
		}
		if h.Fence > 0 {
			what += ", fence " + fmtFence(h.Fence)
		}
		fmt.Fprintf(tw, "holder\t%s (%s)\n", h.Owner, what)
	}
	if st.TTLMillis >= 0 {
		fmt.Fprintf(tw, "ttl\t%s\n", fmtMillis(st.TTLMillis))
	}
	if st.Fence > 0 {
		fmt.Fprintf(tw, "fence\t%s\n", fmtFence(st.Fence))
	}
	if st.Mode != "once" {
		fmt.Fprintf(tw, "last fence\t%s\n", fmtFence(st.LastFence))
	}
	if st.Done {
		fmt.Fprintf(tw, "done\tvalue of %d bytes, mark lasts %s\n", st.ValueBytes, fmtMillis(st.DoneTTLMillis))
	}
	if st.Mode != "" && st.Mode != "once" {
		fmt.Fprintf(tw, "waiters\t%d queued\n", st.WaitersTotal)
	}
	for i, q := range st.Waiters {
		what := ""
		if q.Kind != "" {
			what = q.Kind + ", "
		}
		if q.N > 0 {
			what += fmt.Sprintf("%d permits, ", q.N)
		}
		if q.WaitedMillis >= 0 {
			what += "waited " + fmtMillis(q.WaitedMillis) + ", "
		}
		fmt.Fprintf(tw, "  %d.\t%s (%splace lasts %s)\n", i+1, q.Owner, what, fmtMillis(q.PlaceMillis))
	}
	if n := st.WaitersTotal - int64(len(st.Waiters)); n > 0 {
		fmt.Fprintf(tw, "  ...\t%d more\n", n)
	}
	tw.Flush()
}

// writeTable prints one line per primitive.
func writeTable(w io.Writer, sts []*lockState) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tMODE\tSTATE\tHOLDER\tCOUNT\tTTL\tFENCE\tWAITERS")
	for _, st := range sts {
		owner, count := "-", "-"
		if len(st.Holders) > 0 {
			owner = st.Holders[0].Owner
			count = strconv.FormatInt(st.Holders[0].Count, 10)
			if len(st.Holders) > 1 {
				owner += fmt.Sprintf(" (+%d)", len(st.Holders)-1)
			}
		}
		mode := st.Mode
		if mode == "" {
			mode = "-"
		}
		fence := st.Fence
		if fence == 0 {
			fence = st.LastFence
		}
		ttl := st.TTLMillis
		if ttl < 0 && len(st.Holders) > 0 {
			ttl = st.Holders[0].TTLMillis
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", st.Name, mode, st.State, owner, count,
			fmtMillis(ttl), fmtFence(fence), st.WaitersTotal)
	}
	tw.Flush()
}
