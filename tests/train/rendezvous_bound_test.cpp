// How long a rank waits for the others before training (train/rendezvous_bound.h): --rendezvous-timeout,
// capped by --comm-timeout when that is set and shorter, named in the errors by the flag that decided.
#include <gtest/gtest.h>

#include "train/rendezvous_bound.h"

using namespace qtrain;

TEST(RendezvousBound, TheRendezvousTimeoutCappedByTheCommTimeout) {
    TrainOptions o;
    comm::WaitBound b = rendezvous_bound(o);  // both 600 by default (torchrun's rendezvous waits 600 s)
    EXPECT_EQ(b.seconds, 600);
    EXPECT_EQ(b.setting, "--rendezvous-timeout=600");
    EXPECT_EQ(b.duration().count(), 600000);

    o.rendezvous_timeout = 30;
    EXPECT_EQ(rendezvous_bound(o).setting, "--rendezvous-timeout=30");
    o.comm_timeout = 2.5;
    b = rendezvous_bound(o);
    EXPECT_EQ(b.seconds, 2.5);
    EXPECT_EQ(b.setting, "--comm-timeout=2.5, which caps --rendezvous-timeout=30");
    EXPECT_EQ(b.duration().count(), 2500);

    o.comm_timeout = 0;  // the watchdog off: the rendezvous's own bound
    EXPECT_EQ(rendezvous_bound(o).seconds, 30);
    o.rendezvous_timeout = 0;  // no bound at all
    EXPECT_FALSE(rendezvous_bound(o).bounded());
    o.comm_timeout = 60;  // but --comm-timeout still caps "no limit"
    EXPECT_EQ(rendezvous_bound(o).seconds, 60);
    EXPECT_EQ(rendezvous_bound(o).setting, "--comm-timeout=60, which caps --rendezvous-timeout=0");
}
