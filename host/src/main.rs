use clap::Parser;

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
