//! A cluster across two network namespaces, each a "host" with its own address on a veth
//! pair the test creates (10.21N.x.1 and 10.21N.x.2, N per test, x from the test's process id) and
//! removes even when it fails. The workers bind non-loopback addresses, so they prove a
//! shared secret. Skipped, with the reason printed, where namespaces cannot be created
//! (not root, no `ip`).

use std::process::Command;

use crate::harness::Scratch;

/// Two namespaces joined by a veth pair; removed on drop.
struct Hosts {
    names: [String; 2],
    addresses: [String; 2],
    links: [String; 2],
}

impl Hosts {
    fn create(tag: &str) -> Result<Hosts, String> {
        let id = std::process::id() % 250 + 1;
        let names = [format!("sluice-{tag}-{id}-a"), format!("sluice-{tag}-{id}-b")];
        let links = [format!("sl{tag}{id}a"), format!("sl{tag}{id}b")];
        let subnet = match tag {
            "o" => 213,
            "r" => 215,
            _ => 214,
        };
        let addresses = [format!("10.{subnet}.{id}.1"), format!("10.{subnet}.{id}.2")];
        let hosts = Hosts { names, addresses, links };
        let run = |args: &[&str]| -> Result<(), String> {
            let output = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
            if output.status.success() {
                Ok(())
            } else {
                Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim()))
            }
        };
        // Leftovers of a run that was killed before its cleanup (same names: same pid).
        for name in &hosts.names {
            let _ = Command::new("ip").args(["netns", "delete", name]).output();
        }
        let _ = Command::new("ip").args(["link", "delete", &hosts.links[0]]).output();
        for name in &hosts.names {
            run(&["netns", "add", name])?;
        }
        run(&["link", "add", &hosts.links[0], "type", "veth", "peer", "name", &hosts.links[1]])?;
        for index in 0..2 {
            let (name, link, address) = (&hosts.names[index], &hosts.links[index], &hosts.addresses[index]);
            run(&["link", "set", link, "netns", name])?;
            run(&["-n", name, "addr", "add", &format!("{address}/24"), "dev", link])?;
            run(&["-n", name, "link", "set", link, "up"])?;
            run(&["-n", name, "link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    /// `sluice ARGS` inside host `index`, in `dir`.
    fn sluice(&self, index: usize, dir: &std::path::Path, args: &[&str]) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.names[index], env!("CARGO_BIN_EXE_sluice")]).args(args).current_dir(dir);
        command.env("NO_COLOR", "1");
        command
    }

    /// Cuts host `index`'s end of the link.
    fn cut(&self, index: usize) {
        self.set_link(index, "down");
    }

    /// Restores host `index`'s end of the link.
    fn restore(&self, index: usize) {
        self.set_link(index, "up");
    }

    fn set_link(&self, index: usize, state: &str) {
        let status =
            Command::new("ip").args(["-n", &self.names[index], "link", "set", &self.links[index], state]).status();
        assert!(status.expect("ip").success(), "setting the link {state}");
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "delete", name]).status();
        }
    }
}

fn hosts_or_skip(tag: &str) -> Option<Hosts> {
    match Hosts::create(tag) {
        Ok(hosts) => Some(hosts),
        Err(reason) => {
            eprintln!("skipped: network namespaces cannot be created here ({reason})");
            None
        }
    }
}

const PIPELINE: &str = r#"
[pipeline]
name = "two-hosts"
threads = 1

[[source]]
name = "nexmark"
connector = "nexmark"
[source.options]
EVENTS

[[view]]
name = "counts"
sql = "SELECT auction, COUNT(*) AS n, window_start FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '1' SECOND)) GROUP BY auction, window_start, window_end"

[[sink]]
name = "out"
from = "counts"
connector = "file"
format = "json"
[sink.options]
path = "out/"
"#;

fn prepare(events: &str) -> [Scratch; 2] {
    let scratches = [Scratch::new(), Scratch::new()];
    for scratch in &scratches {
        scratch.write("pipeline.toml", &PIPELINE.replace("EVENTS", events));
        scratch.write("secret", "a shared secret for the two hosts\n");
    }
    scratches
}

/// The two workers; killed on drop, so a failing test leaves nothing running.
struct Workers([Option<std::process::Child>; 2]);

impl Workers {
    fn child(&mut self, index: usize) -> &mut std::process::Child {
        self.0[index].as_mut().expect("running")
    }

    /// Waits for worker `index`; returns its exit code and stderr.
    fn finish(&mut self, index: usize) -> (Option<i32>, String) {
        let output = self.0[index].take().expect("running").wait_with_output().expect("wait");
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in self.0.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn(hosts: &Hosts, scratches: &[Scratch; 2]) -> Workers {
    let leading = leader_command(hosts, &scratches[0]);
    let joining = joiner_command(hosts, &scratches[1]);
    Workers([Some(piped(leading)), Some(piped(joining))])
}

fn piped(mut command: Command) -> std::process::Child {
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("spawn")
}

fn leader_command(hosts: &Hosts, scratch: &Scratch) -> Command {
    let leader = format!("{}:7400", hosts.addresses[0]);
    let exchange = format!("{}:0", hosts.addresses[0]);
    let mut leading = hosts.sluice(0, scratch.dir.path(), &["run", "pipeline.toml", "--workers", "2"]);
    leading.args(["--control-bind", &leader, "--exchange-bind", &exchange, "--secret-file", "secret"]);
    leading
}

/// The joining worker's command: the same every time it is (re)started.
fn joiner_command(hosts: &Hosts, scratch: &Scratch) -> Command {
    let leader = format!("{}:7400", hosts.addresses[0]);
    let exchange = format!("{}:0", hosts.addresses[1]);
    let mut joining = hosts.sluice(1, scratch.dir.path(), &["run", "pipeline.toml", "--join", &leader]);
    joining.args(["--exchange-bind", &exchange, "--secret-file", "secret"]);
    joining
}

#[test]
fn two_hosts_write_what_one_host_with_two_threads_writes() {
    let Some(hosts) = hosts_or_skip("o") else { return };
    let scratches = prepare("events = 60000");
    let mut workers = spawn(&hosts, &scratches);
    for (index, name) in ["leader", "joiner"].into_iter().enumerate() {
        let (code, seen) = workers.finish(index);
        assert_eq!(code, Some(0), "{name}:\n{seen}");
    }
    let solo = Scratch::new();
    solo.write("pipeline.toml", &PIPELINE.replace("EVENTS", "events = 60000").replace("threads = 1", "threads = 2"));
    assert!(solo.sluice(&["--quiet", "run", "pipeline.toml"]).status.success());
    let lines = |scratch: &Scratch| crate::harness::sorted_lines(&crate::golden::output(scratch, "out"));
    let mut cluster: Vec<String> = scratches.iter().flat_map(lines).collect();
    cluster.sort();
    assert!(cluster.len() > 1000);
    assert_eq!(cluster, lines(&solo));
}

#[test]
fn a_cut_link_is_detected_on_both_hosts_by_the_heartbeats() {
    let Some(hosts) = hosts_or_skip("c") else { return };
    let scratches = prepare("rate = 2000");
    for scratch in &scratches {
        let pipeline = scratch
            .read("pipeline.toml")
            .replace("connector = \"file\"", "connector = \"stdout\"")
            .replace("[sink.options]\npath = \"out/\"\n", "");
        scratch.write("pipeline.toml", &pipeline);
    }
    let mut workers = spawn(&hosts, &scratches);
    // Rows flow across the link once the leader prints a window (a stdout sink runs on
    // the leader, fed by both workers).
    let mut stdout = std::io::BufReader::new(workers.child(0).stdout.take().expect("stdout"));
    let mut first = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut first).expect("a window");
    if !first.contains("auction") {
        let (_, seen) = workers.finish(0);
        panic!("the leader wrote no window:\n{seen}");
    }
    // Keep reading in the background: a full pipe must not hold the sink.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    hosts.cut(1);
    let (code, seen) = workers.finish(0);
    assert_eq!(code, Some(1), "{seen}");
    assert!(seen.contains("worker 1") && seen.contains("lost"), "the leader names the lost worker:\n{seen}");
    let (code, seen) = workers.finish(1);
    assert_eq!(code, Some(1), "{seen}");
    assert!(seen.contains("lost the leader"), "the worker says it lost the leader:\n{seen}");
}

/// Reads `reader` until a line contains `needle` (or it ends); returns everything read.
fn read_until(reader: &mut impl std::io::BufRead, needle: &str) -> String {
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).expect("stderr") == 0 || line.contains(needle) {
            seen.push_str(&line);
            return seen;
        }
        seen.push_str(&line);
    }
}

/// With checkpoints into a store both hosts reach (their namespaces share the file
/// system), the joining worker is killed mid-checkpoint and restarted with the same
/// command, then its link is cut until the leader and it both notice, restored, and the
/// worker restarted again: the leader re-forms the cluster each time, and the output
/// equals one host's uninterrupted run.
#[test]
fn a_killed_worker_and_a_cut_link_are_each_restored_and_the_output_is_exactly_once() {
    let Some(hosts) = hosts_or_skip("r") else { return };
    let shared = Scratch::new();
    let pipeline = PIPELINE
        .replace("EVENTS", "events = 6000")
        .replacen("[pipeline]\n", "[pipeline]\nbatch_size = 50\n", 1)
        .replacen(
            "\n[[source]]",
            &format!(
                "\n[checkpoint]\ninterval = \"10ms\"\nstore = \"file://{}\"\n\n[[source]]",
                shared.path("state").display()
            ),
            1,
        )
        .replace("path = \"out/\"", &format!("path = \"{}/\"", shared.path("out").display()));
    let reference = Scratch::new();
    reference.write(
        "pipeline.toml",
        &pipeline.replace(&shared.path("").display().to_string(), &reference.path("").display().to_string()),
    );
    let run = reference.sluice(&["--quiet", "run", "pipeline.toml"]);
    assert!(run.status.success(), "{}", crate::harness::stderr(&run));
    let scratches = prepare("");
    for scratch in &scratches {
        scratch.write("pipeline.toml", &pipeline);
    }
    let barriers = "source.barrier_after_batch=return";
    let mut leading = leader_command(&hosts, &scratches[0]);
    leading.env("SLUICE_FAILPOINTS", barriers);
    // Both killed on drop: a failing test leaves nothing running.
    let mut workers = Workers([Some(piped(leading)), None]);
    let mut leader_err = std::io::BufReader::new(workers.child(0).stderr.take().expect("stderr"));
    let mut joining = joiner_command(&hosts, &scratches[1]);
    joining.env("SLUICE_FAILPOINTS", format!("{barriers};checkpoint.after_state_written=29*off->return(kill)"));
    let killed = piped(joining).wait_with_output().expect("wait");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&killed.status), Some(9), "killed at its failpoint");
    let mut seen = read_until(&mut leader_err, "forming the cluster again");

    let mut joining = joiner_command(&hosts, &scratches[1]);
    joining.env("SLUICE_FAILPOINTS", barriers);
    workers.0[1] = Some(piped(joining));
    let mut joiner_err = std::io::BufReader::new(workers.child(1).stderr.take().expect("stderr"));
    let joined = read_until(&mut joiner_err, "running pipeline");

    assert!(joined.contains("resuming from checkpoint"), "{joined}");
    hosts.cut(1);
    seen.push_str(&read_until(&mut leader_err, "forming the cluster again"));
    let isolated = std::io::read_to_string(&mut joiner_err).expect("stderr");
    assert_eq!(workers.child(1).wait().expect("wait").code(), Some(1), "{isolated}");
    assert!(isolated.contains("lost the leader"), "{isolated}");
    hosts.restore(1);

    let restarted = joiner_command(&hosts, &scratches[1]).output().expect("run");
    let text = crate::harness::stderr(&restarted);
    assert!(restarted.status.success(), "{text}");
    seen.push_str(&std::io::read_to_string(&mut leader_err).expect("stderr"));
    assert_eq!(workers.child(0).wait().expect("wait").code(), Some(0), "{seen}");
    let lines = |dir: &Scratch| crate::harness::sorted_lines(&crate::golden::output(dir, "out"));
    assert!(lines(&reference).len() > 300, "a real workload");
    assert_eq!(lines(&shared), lines(&reference));
}
