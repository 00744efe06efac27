"""The Kafka front's checksum is Kafka's: a wrong CRC32C makes clients that check CRCs reject
every batch the front rewrites after a compaction."""

from devstack.kafka.protocol import crc32c


def test_crc32c_matches_the_castagnoli_check_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(b"") == 0
