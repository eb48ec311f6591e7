from services.scheduler.batching.ratelimit import Need, RateLimiter, instance_needs, parse_resources


def test_instance_needs_follow_the_groups():
    config = {
        "instance_group": [
            {"count": 2, "rate_limiter": {"resources": [{"name": "R", "count": 2}], "priority": 2}},
            {"count": 1},
        ]
    }
    needs = instance_needs(config)
    assert needs == [Need((("R", False, 2),), 2), Need((("R", False, 2),), 2), Need((), 1)]


def test_gpu_groups_have_count_instances_per_listed_gpu():
    config = {
        "instance_group": [
            {
                "kind": "KIND_GPU",
                "count": 2,
                "gpus": [0, 1],
                "rate_limiter": {"resources": [{"name": "R", "count": 1}]},
            },
            {"kind": "KIND_CPU", "count": 1},
        ]
    }
    assert instance_needs(config) == [Need((("R", False, 1),))] * 4 + [Need()]


def test_per_device_pools_default_to_the_largest_need():
    limiter = RateLimiter(True)
    need = Need((("R", False, 2),))
    limiter.learn([need])
    assert limiter.can_run(need, "w1")
    limiter.acquire(need, "w1", ("w1", ("m", 1), 0))
    assert not limiter.can_run(need, "w1")
    assert limiter.can_run(need, "w2")  # another device has its own pool
    limiter.release(need, "w1")
    assert limiter.can_run(need, "w1")


def test_global_resources_are_shared_and_flags_set_capacity():
    limiter = RateLimiter(True, parse_resources(["G:3"]))
    need = Need((("G", True, 2),))
    limiter.learn([need])
    limiter.acquire(need, "w1", ("w1", ("m", 1), 0))
    assert not limiter.can_run(need, "w2")  # 2 + 2 > 3, whatever the device
    assert limiter.can_run(Need((("G", True, 1),)), "w2")


def test_priority_weighs_the_chances():
    limiter = RateLimiter(True)
    high, low = Need((), 1), Need((), 2)
    limiter.acquire(high, "w", ("w", ("a", 1), 0))
    limiter.acquire(low, "w", ("w", ("b", 1), 0))
    assert limiter.weight(high, ("w", ("a", 1), 0)) < limiter.weight(low, ("w", ("b", 1), 0))


def test_disabled_limiter_never_holds_back():
    limiter = RateLimiter(False)
    need = Need((("R", False, 5),))
    assert limiter.can_run(need, "w")
