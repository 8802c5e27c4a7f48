//! Standard output for results (listings, explanations, generated events): a reader
//! that goes away (`sluice … | head -1`) ends the program quietly, as other command-line
//! tools do, instead of a panic or an error message.

use std::io::Write;

/// Writes `text` as it is; exits quietly (status 0) if standard output was closed.
pub fn text(text: &str) {
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        closed(&error);
    }
}

/// Writes `line` and a line break.
pub fn line(line: &str) {
    text(&format!("{line}\n"));
}

/// The reader of standard output went away: nothing more can be shown, and the program
/// exits without a word. Any other failure is reported.
pub fn closed(error: &std::io::Error) -> ! {
    if error.kind() != std::io::ErrorKind::BrokenPipe {
        eprintln!("error: cannot write to standard output: {error}");
        std::process::exit(1);
    }
    std::process::exit(0);
}
