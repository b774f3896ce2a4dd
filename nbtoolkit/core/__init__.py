"""The core every feature builds on: errors, units, the result and display base, the ProfilerStep
parser, the step runner, the magic framework, bounded reading and saving."""
