//! Brokers that lose their data or die under a running pipeline: an offset the
//! partition no longer holds, or one a recreated partition holds again, is found and
//! handled per `offset_out_of_range`.

use std::process::ExitStatus;

use super::*;

/// Waits (at most [`GROUP_WAIT`]) for `member` to exit on its own; its exit and log.
fn exit_of(mut member: Member) -> (ExitStatus, String) {
    let deadline = Instant::now() + GROUP_WAIT;
    let exit = loop {
        member.log.extend(member.lines.try_iter());
        if let Some(exit) = member.child.try_wait().expect("wait") {
            break exit;
        }
        assert!(Instant::now() < deadline, "pipeline {} did not exit:\n{}", member.name, member.log.join("\n"));
        if let Ok(line) = member.lines.recv_timeout(Duration::from_millis(100)) {
            member.log.push(line);
        }
    };
    member.log.extend(member.lines.iter());
    (exit, member.log.join("\n"))
}

impl Broker {
    /// Deletes `topic` and creates it again, empty, with `partitions`.
    fn recreate_topic(&mut self, topic: &str, partitions: u32) {
        let output = Command::new(&self.binary)
            .args(["topic", "delete", topic, "--broker", &format!("tcp://{}", self.address)])
            .output()
            .expect("run tansu topic delete");
        assert!(output.status.success(), "deleting {topic}: {}", String::from_utf8_lossy(&output.stderr));
        self.create_topic(topic, partitions).expect("the topic is created again");
    }
}

/// Produces `values` to `partition` of `topic` in one batch (one request, one flush):
/// the test broker then reports the partition's end as the batch's first offset plus
/// one, short of the true end.
fn produce_one_batch(broker: &Broker, topic: &str, partition: i32, values: &[String]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &broker.address)
        .set("linger.ms", "1000")
        .create()
        .expect("producer");
    for value in values {
        producer
            .send(BaseRecord::<'_, str, str>::to(topic).partition(partition).payload(value))
            .map_err(|(e, _)| e)
            .expect("send");
    }
    producer.flush(WAIT).expect("the broker acknowledged");
}

fn bid(price: usize) -> String {
    format!("{{\"auction\":1,\"price\":{price},\"date_time\":\"2026-01-01 00:00:00\"}}")
}

/// Copies each bid's price from `bids` to `copies`, checkpointing every 200 ms.
fn copier(broker: &Broker, source_options: &str) -> String {
    format!(
        "[pipeline]\nname = \"p\"\nbatch_size = 4\n\n\
         [checkpoint]\ninterval = \"200ms\"\nstore = \"file://./state\"\nguarantee = \"at-least-once\"\n\n\
         [[source]]\nname = \"bids\"\nconnector = \"kafka\"\nformat = \"json\"\n\
         schema = \"auction BIGINT, price BIGINT, date_time TIMESTAMP(3)\"\n\
         [source.options]\nbrokers = \"{0}\"\ntopic = \"bids\"\n{source_options}\n\
         [[view]]\nname = \"copies\"\nsql = \"SELECT price FROM bids\"\n\n\
         [[sink]]\nname = \"out\"\nfrom = \"copies\"\nconnector = \"kafka\"\n[sink.options]\nbrokers = \"{0}\"\n\
         topic = \"copies\"\n",
        broker.address
    )
}

/// The finding: a pipeline had read offsets 0..20 of each partition and checkpointed
/// them; the topic was deleted and recreated and fewer records produced. The restart
/// fails naming the partition, the offset and the partition's range, with the fix;
/// with `offset_out_of_range = "earliest"` it reads what the partition holds now.
///
/// Before that, a restart over the very topic it read must not fail: the records were
/// produced in one batch per partition, so the test broker reports each partition's
/// end as 1 while the checkpoint holds 20 (the check reads the last batch to tell), and
/// the last record each lane read is read again and found the same.
#[test]
fn a_checkpoint_past_the_end_of_a_recreated_topic_fails_or_resets_as_configured() {
    let mut broker = Broker::with_topics(&[("bids", 2), ("copies", 1)]);
    for partition in 0..2 {
        let values: Vec<String> = (0..20).map(|i| bid(i * 2 + partition as usize)).collect();
        produce_one_batch(&broker, "bids", partition, &values);
    }
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &copier(&broker, ""));
    let first = Member::start(&scratch, "first", "");
    broker.consume_until("copies", 1, |found| prices(found).len() == 40);
    first.stop();

    // The same topic: the checkpoint's offsets (20) are past the reported ends (1).
    let mut second = Member::start(&scratch, "second", "");
    second.wait_for("resuming from the checkpoint", |line| line.contains("resuming from checkpoint"));
    broker.produce("bids", &[(1, None, &bid(40))]);
    broker.consume_until("copies", 1, |found| prices(found).contains(&40));
    let log = second.stop();
    assert!(!log.contains("offset_out_of_range"), "no offset was out of range:\n{log}");

    // The broker loses the data: the topic is recreated with 5 records per partition.
    broker.recreate_topic("bids", 2);
    let fresh: Vec<(i32, Option<String>, String)> = (0..10i32).map(|i| (i % 2, None, bid(1000 + i as usize))).collect();
    produce_bids(&broker, "bids", &fresh);
    let (exit, log) = exit_of(Member::start(&scratch, "third", ""));
    assert!(!exit.success(), "the restart fails:\n{log}");
    let named = |offset: i64, partition: i32| {
        log.contains(&format!(
            "the restored checkpoint's offset {offset} is past the end of bids/{partition} (topic/partition), which \
             holds offsets 0..5 (earliest 0, end 5)"
        ))
    };
    assert!(named(20, 0) || named(21, 1), "the partition, the offset and the range are named:\n{log}");
    assert!(log.contains("offset_out_of_range = \"earliest\"") && log.contains("--from-scratch"), "the fix:\n{log}");

    scratch.write("pipeline.toml", &copier(&broker, "offset_out_of_range = \"earliest\"\n"));
    let mut fourth = Member::start(&scratch, "fourth", "");
    fourth.wait_for("the reset logged", |line| line.contains("past the end of bids/0") && line.contains("offset 0"));
    broker.consume_until("copies", 1, |found| (1000..1010).all(|price| prices(found).contains(&price)));
    fourth.stop();
}

/// The finding itself: a pipeline had read offsets 0..20 of each partition and
/// checkpointed them; the topic was deleted and recreated and MORE records produced
/// (50 per partition), so the checkpoint's offsets are in range. The restart fails
/// naming the partition, the offset, the record read last and the one found there, with
/// the fix; with `offset_out_of_range = "earliest"` it reads the new topic from offset 0.
#[test]
fn a_checkpoint_inside_a_recreated_topic_refilled_past_it_fails_or_resets_as_configured() {
    let mut broker = Broker::with_topics(&[("bids", 2), ("copies", 1)]);
    for partition in 0..2 {
        let values: Vec<String> = (0..20).map(|i| bid(i * 2 + partition as usize)).collect();
        produce_one_batch(&broker, "bids", partition, &values);
    }
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &copier(&broker, ""));
    let first = Member::start(&scratch, "first", "");
    broker.consume_until("copies", 1, |found| prices(found).len() == 40);
    first.stop();

    // The broker loses the data; the topic is recreated and refilled past offset 20.
    broker.recreate_topic("bids", 2);
    let fresh: Vec<(i32, Option<String>, String)> =
        (0..100i32).map(|i| (i % 2, None, bid(1000 + i as usize))).collect();
    produce_bids(&broker, "bids", &fresh);
    let (exit, log) = exit_of(Member::start(&scratch, "second", ""));
    assert!(!exit.success(), "the restart fails:\n{log}");
    let named = |partition: i32| {
        log.contains(&format!(
            "the restored checkpoint's offset 20 is in range of bids/{partition} (topic/partition), but the \
             partition no longer holds the records read before it: the last one read was at offset 19, timestamp"
        ))
    };
    assert!(named(0) || named(1), "the partition, the offset and the record read last are named:\n{log}");
    assert!(log.contains("holds another record there (offset 19, timestamp"), "the record found is named:\n{log}");
    assert!(log.contains("offset_out_of_range = \"earliest\"") && log.contains("--from-scratch"), "the fix:\n{log}");

    scratch.write("pipeline.toml", &copier(&broker, "offset_out_of_range = \"earliest\"\n"));
    let mut third = Member::start(&scratch, "third", "");
    third.wait_for("the reset logged", |line| {
        line.contains("no longer holds the records read before it") && line.contains("reading from offset 0")
    });
    broker.consume_until("copies", 1, |found| (1000..1100).all(|price| prices(found).contains(&price)));
    third.stop();
}

/// NEXMark's bids into the topic `copies` without checkpoints, the sink giving the
/// brokers `delivery_timeout` to acknowledge each message.
fn bid_writer(broker: &Broker, delivery_timeout: &str) -> String {
    format!(
        "[pipeline]\nname = \"p\"\n\n\
         [[source]]\nname = \"nexmark\"\nconnector = \"nexmark\"\n[source.options]\nrate = 5000\n\n\
         [[sink]]\nname = \"out\"\nfrom = \"bid\"\nconnector = \"kafka\"\n[sink.options]\nbrokers = \"{}\"\n\
         topic = \"copies\"\ndelivery_timeout = \"{delivery_timeout}\"\n",
        broker.address
    )
}

/// The `rows out` of sink `out` in a run's report.
fn rows_out(log: &str) -> usize {
    log.lines()
        .find_map(|line| line.trim().strip_prefix("sink out: ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no rows out in the report:\n{log}"))
}

/// Sends `signal` (`-STOP`, `-CONT`, `-KILL`) to the broker's process.
fn signal(broker: &Broker, signal: &str) {
    let status = Command::new("kill").args([signal, &broker.child.id().to_string()]).status().expect("kill");
    assert!(status.success(), "kill {signal}");
}

/// The finding: a Kafka sink whose broker died 6 s into a run failed 103 s later with
/// "QueueFull", not naming the brokers, and its report counted 227,355 rows out when at
/// most about 30,000 could have reached the broker. Here, once the sink's first records
/// reached the broker, the broker stops answering (SIGSTOP, so that what it holds can be
/// counted afterwards): with delivery_timeout = "2s" the run fails with brokers lost,
/// naming them and the fix, and its rows out are at most the records the broker holds
/// once it answers again. Then a run whose broker is killed fails the same way.
#[test]
fn a_sink_whose_broker_is_lost_fails_naming_it_and_counts_only_what_it_acknowledged() {
    let broker = Broker::with_topics(&[("copies", 1)]);
    let scratch = Scratch::new();
    scratch.write("pipeline.toml", &bid_writer(&broker, "2s"));
    let writer = Member::start(&scratch, "frozen", "");
    broker.consume_until("copies", 1, |found| found.len() >= 1000);
    signal(&broker, "-STOP");
    let (exit, log) = exit_of(writer);
    signal(&broker, "-CONT");
    assert!(!exit.success(), "the run fails:\n{log}");
    let lost = format!("sink `out`: lost the Kafka brokers {}", broker.address);
    assert!(log.contains(&lost) && log.contains("delivery_timeout = 2000 ms"), "the brokers are named:\n{log}");
    assert!(log.contains("restart the brokers") && !log.contains("QueueFull"), "with the fix:\n{log}");
    let held = broker.consume_all("copies", 1).len();
    let out = rows_out(&log);
    assert!(out <= held, "{out} rows out, but the broker holds {held} records:\n{log}");

    let writer = Member::start(&scratch, "killed", "");
    broker.consume_until("copies", 1, |found| found.len() >= held + 1000);
    signal(&broker, "-KILL");
    let (exit, log) = exit_of(writer);
    assert!(!exit.success(), "the run fails:\n{log}");
    assert!(log.contains(&lost) && log.contains("delivery_timeout = 2000 ms"), "the brokers are named:\n{log}");
}
