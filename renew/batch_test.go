package renew_test

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestBatchRenewsManyInOneCall: holds with a Batch script are renewed
// together, one call for all of them, and a hold whose key is gone is lost
// alone; after SCRIPT FLUSH the batch script is loaded again.
func TestBatchRenewsManyInOneCall(t *testing.T) {
	eachBackend(t, false, func(t *testing.T, b *backend) {
		const (
			ttl      = 900 * time.Millisecond
			interval = 100 * time.Millisecond
			n        = 20
		)
		r := newRenewer(t, b)
		specs := make([]string, n)
		holds := make([]interface {
			Done() <-chan struct{}
			Err() error
		}, n)
		for i := range holds {
			s := acquire(t, b, ttl)
			s.Batch = batchScript
			s.Interval = interval
			s.Start = time.Now()
			specs[i] = s.Keys[0]
			holds[i] = r.Add(s)
		}
		ctx := context.Background()
		// The first hold's key goes: it alone is lost.
		if err := b.probe.Del(ctx, specs[0]).Err(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-holds[0].Done():
		case <-time.After(3 * ttl):
			t.Fatal("hold with a deleted key not reported lost")
		}
		if err := holds[0].Err(); !errors.Is(err, errTestLost) {
			t.Fatalf("Err = %v, want the lost error", err)
		}
		if err := b.probe.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		b.cnt.evals.Store(0)
		time.Sleep(3 * ttl) // the keys live only if renewed
		for i := 1; i < n; i++ {
			select {
			case <-holds[i].Done():
				t.Fatalf("hold %d ended: %v", i, holds[i].Err())
			default:
			}
			if ttl, err := b.probe.PTTL(ctx, specs[i]).Result(); err != nil || ttl <= 0 {
				t.Fatalf("key %d PTTL = %v, %v: not renewed", i, ttl, err)
			}
		}
		// 19 holds renewed for 2.7 s every 0.1 s: one call per pass, not 19.
		if evals := b.cnt.evals.Load(); evals > 60 {
			t.Errorf("%d script calls for 19 batched holds over 27 intervals, want about one per interval", evals)
		}
	})
}
