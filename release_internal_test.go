package dsync

import (
	"context"
	"errors"
	"testing"
)

// A release's ctx (see settle) is its caller's ctx without the
// cancellation, as context.WithoutCancel makes it: its values, no
// deadline, never done, and no cause however the caller's ctx ended; and
// it carries the release's fate.
func TestFateCtxIsWithoutCancel(t *testing.T) {
	type key struct{}
	cause := errors.New("caller's cause")
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), key{}, "v"))
	parent, stop := context.WithTimeout(parent, 1<<40)
	defer stop()
	c := &fateCtx{parent: parent}
	cancel(cause)
	if parent.Err() == nil || context.Cause(parent) != cause {
		t.Fatalf("parent: err %v, cause %v", parent.Err(), context.Cause(parent))
	}
	if _, ok := c.Deadline(); ok {
		t.Error("a deadline")
	}
	if c.Done() != nil || c.Err() != nil {
		t.Errorf("done %v, err %v", c.Done(), c.Err())
	}
	if got := context.Cause(c); got != nil {
		t.Errorf("cause %v", got)
	}
	if got := c.Value(key{}); got != "v" {
		t.Errorf("value %v", got)
	}
	if c.Value(fateKey{}) != &c.fate {
		t.Error("not the release's fate")
	}
	// A ctx made from it for a retry is its own.
	d, cancelD := context.WithCancel(c)
	defer cancelD()
	if d.Err() != nil || context.Cause(d) != nil {
		t.Errorf("derived: err %v, cause %v", d.Err(), context.Cause(d))
	}
}
