"""How long a fetch of a consumer that follows a topic's end may wait on the broker.

Two consumers of an instance sit at the end of their partitions and wait for a few records a
hand-over is waiting on: the assignment follower (the operator's word to release or take a
task) and the restore loop (the old owner's last batch, then the new owner's own epoch marker,
read back). librdkafka asks the broker to hold a fetch that finds nothing new for
fetch.wait.max.ms (500 ms by default) and sends the next one only when the answer comes. A
broker that answers as soon as records arrive (Kafka) makes that wait cost nothing; one that
holds the fetch for its whole wait (librdkafka's mock brokers, measured: a record written
while the fetch waits was read 0.38 s later, median over 12) adds up to the wait to each of
the four reads of a hand-over. At 100 ms the reads take 0.09 s (median), and an idle follower
sends ten fetches a second per broker (0.35% of a core here with 8 partitions on 3 brokers, the
brokers' work included).
"""

FOLLOWER_SETTINGS = {"fetch.wait.max.ms": "100"}
