# frozen_string_literal: true

# Boots the Rails application written by spec/support/rails_app.rb (ARGV[0]) and drives it as
# a developer would: the install task, db:migrate, the verify_toml task, then the scaffold
# controller through Rack (ActionDispatch::Integration::Session). Prints one JSON object.
require "json"
require "stringio"

root = ARGV.fetch(0)
Dir.chdir(root)
require File.join(root, "config", "environment")
require "rake"
require "action_dispatch/testing/integration"
Rails.application.load_tasks

def capture
  out = $stdout
  $stdout = StringIO.new
  yield
  $stdout.string
ensure
  $stdout = out
end

results = {}
config = TopologyClaims.configuration
results[:config] = { cell_id: config.cell_id, address: config.address, timeout: config.timeout,
                     in_transaction_deadline: config.in_transaction_deadline }
results[:install] = capture { Rake::Task["topology_claims:install"].invoke }
results[:install_again] = capture do
  Rake::Task["topology_claims:install"].reenable
  Rake::Task["topology_claims:install"].invoke
end
capture { Rake::Task["db:migrate"].invoke }
results[:tables] = ActiveRecord::Base.connection.tables.sort
results[:models_before_verify] = TopologyClaims::Claimable.models.map(&:name)
toml_path = File.join(root, "verify.toml")
ENV["FILE"] = toml_path
Rake::Task["topology_claims:verify_toml"].invoke
results[:verify_toml] = File.read(toml_path)

session = ActionDispatch::Integration::Session.new(Rails.application)
request = lambda do |verb, path, params|
  session.public_send(verb, path, params: params, as: :json)
  [session.response.status, JSON.parse(session.response.body)]
rescue StandardError => e
  [e.class.name, e.message]
end
taken_name = ENV.fetch("TC_TAKEN_USERNAME")
taken_mail = ENV.fetch("TC_TAKEN_EMAIL")
free = ENV.fetch("TC_FREE")
results[:create_taken] = request.call(:post, "/users", user: { username: taken_name, email: taken_mail })
results[:create_free] = request.call(:post, "/users", user: { username: free, email: "#{free}@example.com" })
id = results[:create_free][1]["id"]
results[:update_taken] = request.call(:patch, "/users/#{id}", user: { email: taken_mail })
results[:update_free] = request.call(:patch, "/users/#{id}", user: { email: "#{free}@new.example.com" })
results[:users] = User.order(:id).pluck(:username, :email)
puts JSON.generate(results)
