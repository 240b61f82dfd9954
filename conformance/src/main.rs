//! `idem-conformance`: the command line of the conformance kit. Thin by
//! design: parse arguments, set up tracing, call the library.

use clap::Parser;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = idem_conformance::cli::Cli::parse();
    let code = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt.block_on(idem_conformance::cli::execute(cli)),
        Err(e) => {
            eprintln!("idem-conformance: cannot start the async runtime: {e}");
            idem_conformance::EXIT_HARNESS
        }
    };
    std::process::exit(code);
}
