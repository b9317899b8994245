use clap::Parser;

// jemalloc rather than glibc's malloc: malloc, free and their
// consolidation were a fifth of the process's CPU under load (README,
// "Performance"), and its memory stays within B8's goals.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    let cli = gavel::cli::Cli::parse();
    gavel::telemetry::init(cli.log_format, cli.default_log_filter());
    match gavel::cli::run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::from(2)
        }
    }
}
