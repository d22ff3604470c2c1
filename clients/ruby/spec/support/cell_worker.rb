# frozen_string_literal: true

# A cell's application process of its own, for the specs that need one: forked workers, a race
# between two processes, a process killed before or after its COMMIT. Loads the models (no call
# is made at load), then does TC_MODE. Prints one line, `ok` or `error CLASS: MESSAGE`.
$LOAD_PATH.unshift File.expand_path("../../lib", __dir__)
require_relative "cells"

cell = Cells.build(adapter: ENV.fetch("TC_ADAPTER").to_sym, name: ENV.fetch("TC_CELL"),
                   cell_id: ENV.fetch("TC_CELL_ID"), database: ENV.fetch("TC_DB"),
                   address: ENV.fetch("TC_SERVER"), fresh: false)
username = ENV.fetch("TC_USERNAME")
email = ENV.fetch("TC_EMAIL", nil)
$stdout.sync = true

save = lambda do |name, mail|
  user = cell.user.new(username: name, email: mail)
  if user.save
    "ok"
  else
    "invalid #{user.errors.full_messages.join(', ')}"
  end
rescue StandardError => e
  "error #{e.class}: #{e.message}"
end

case ENV.fetch("TC_MODE")
when "fork"
  # Preforking server: the parent loaded the models and made no call; each worker saves.
  workers = Integer(ENV.fetch("TC_WORKERS", "2"))
  pids = workers.times.map do |i|
    fork do
      puts "worker #{i}: #{save.call("#{username}-#{i}", nil)}"
      exit(0) # at_exit deletes the committed rows (exit! would leave them to the reconciler)
    end
  end
  pids.each { |pid| Process.wait(pid) }
when "race"
  # Waits for the start file, so that both racers send at once.
  start = ENV.fetch("TC_START")
  sleep 0.005 until File.exist?(start)
  puts save.call(username, email)
when "kill_before_commit"
  ActiveSupport::Notifications.subscribe("lease_begun.topology_claims") { Process.kill(:KILL, Process.pid) }
  puts save.call(username, email)
when "kill_after_commit"
  ActiveSupport::Notifications.subscribe("local_committed.topology_claims") { Process.kill(:KILL, Process.pid) }
  puts save.call(username, email)
else
  abort "unknown TC_MODE #{ENV['TC_MODE']}"
end
