// Package storetest is the behaviour suite of a ratelimit.Store. A store
// passes storetest: that is the contract every store of this module keeps
// (memstore, redisstore on a single server, on Sentinel and on Cluster,
// and package fallback's wrapper over them), and the one a store written
// elsewhere should keep. Run it from the store's tests:
//
//	func TestStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) ratelimit.Store {
//			return mystore.New()
//		})
//	}
//
// The suite drives the store through ratelimit.Limiter, as a program
// would, with a clock of its own: every Request carries its Now, and the
// store must decide at that time, not its own. Time moves only on that
// clock: no case sleeps. Every decision is checked to the token and to the
// microsecond of RetryAfter and ResetAfter, the values of package
// tokenbucket's arithmetic: a store that rounds, or refills in steps,
// fails.
//
// The cases of every Store check that a full bucket admits its capacity
// and then denies with the exact wait; that refill is smooth and keeps
// the fraction of a token; that a denial takes nothing; that a peek takes
// nothing; that Reset deletes the bucket, so the next check starts full;
// that subjects and namespaces are apart; that a changed policy carries
// the tokens over without minting any; that a clock gone backwards
// credits nothing; that several limits are decided as one; that the
// largest values a Limit allows stay exact; that concurrent checks at one
// instant admit exactly the capacity; and that the store itself refuses
// an invalid Request with an error wrapping ratelimit.ErrInvalidArgument.
//
// A store that is a ratelimit.Reserver must also be a
// ratelimit.Refunder; its cases check that a settle refunds what was
// reserved and not used, once, from any Limiter; that an overrun is
// charged into debt down to minus the capacity; that each limit keeps its
// own cost; that a reservation is found only under its own key; and that
// a refund never lifts a bucket past its capacity. A ratelimit.BatchStore
// has cases for ApplyBatch, decided item by item, and for ApplyAll, all or
// nothing. A ratelimit.Assigner's cases check that an assignment is set,
// replaced and removed, returning the value replaced; that the changes since
// a cursor are each subject's latest value, and a cursor the store did not
// give lists the whole set; that namespaces keep their own; and, through
// ratelimit.Plans, that a subject assigned another plan is checked by it
// with its bucket and quota carried over, that a policy of a subject's own
// comes back equal, that an unknown plan changes nothing, and that another
// Plans on the store applies a change at its next refresh. The cases of a
// capability the store lacks are skipped.
package storetest
