from services.scheduler.batching.ordering import OrderedRelease


def test_later_responses_wait_for_earlier_ones():
    release = OrderedRelease()
    for rid in ("a", "b", "c"):
        release.arrived(rid)
    assert release.finished("c", "rc", b"C") == []
    assert release.finished("b", "rb", b"B") == []
    assert release.finished("a", "ra", b"A") == [("ra", b"A"), ("rb", b"B"), ("rc", b"C")]
    assert len(release) == 0


def test_expired_request_unblocks_the_rest():
    release = OrderedRelease()
    release.arrived("a")
    release.arrived("b")
    assert release.finished("b", "rb", b"B") == []
    assert release.finished("a", "ra", None) == [("rb", b"B")]


def test_request_not_tracked_is_released_at_once():
    release = OrderedRelease()
    release.arrived("a")
    assert release.finished("x", "rx", b"X") == [("rx", b"X")]
