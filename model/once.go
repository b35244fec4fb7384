package model

// Once is the model of dsync.Once.
//
//   - Begin(tok) is a call of Do arriving: Done if the Once is done (f is
//     not called), Run if the call takes the run lease (it must call f),
//     Wait if another call's run lease lives.
//   - End(tok, ok) is f returning: with ok the Once is done and Do returns
//     nil — also if the run lease expired meanwhile, provided nobody else
//     is running, and if another call has made the Once done since (Do
//     then returns that call's value); otherwise LeaseLost. Without ok the
//     run ends and Do returns f's error (Failed); the Once stays not done.
//   - The done mark lasts the period (0: forever) from the successful End,
//     or until Reset.
type Once struct {
	clk     *Clock
	ttl     int64
	period  int64
	done    bool
	doneEnd int64 // with a period: the mark is gone at doneEnd
	run     *hold
}

// State is what a call of Do finds.
type State int

// What a call of Do finds.
const (
	Done State = iota // the name is done: return without running f
	Run               // the caller takes the run lease and runs f
	Wait              // another call runs f: wait
)

// String returns "done", "run" or "wait".
func (s State) String() string {
	return [...]string{"done", "run", "wait"}[s]
}

// NewOnce returns a Once, not done, whose run lease lasts ttl ms and whose
// done mark lasts period ms (0: until Reset).
func NewOnce(clk *Clock, ttl, period int64) *Once {
	return &Once{clk: clk, ttl: ttl, period: period}
}

func (o *Once) prune() {
	now := o.clk.Now()
	if o.done && o.period > 0 && now >= o.doneEnd {
		o.done = false
	}
	if !o.run.alive(now) {
		o.run = nil
	}
}

// Begin is the arrival of the call tok.
func (o *Once) Begin(tok string) State {
	o.prune()
	switch {
	case o.done:
		return Done
	case o.run != nil:
		return Wait
	}
	o.run = &hold{tok: tok, count: 1, deadline: o.clk.Now() + o.ttl}
	return Run
}

// End is the return of f in the call tok, which got Run.
func (o *Once) End(tok string, ok bool) Err {
	o.prune()
	mine := o.run != nil && o.run.tok == tok
	if !ok {
		if mine {
			o.run = nil
		}
		return Failed
	}
	if mine || (o.run == nil && !o.done) {
		o.run = nil
		o.done = true
		o.doneEnd = o.clk.Now() + o.period
		return OK
	}
	if o.done {
		// Done by another call since: its result is every caller's.
		return OK
	}
	return LeaseLost
}

// IsDone reports whether the Once is done.
func (o *Once) IsDone() bool {
	o.prune()
	return o.done
}

// Reset removes the done mark.
func (o *Once) Reset() { o.done = false }
